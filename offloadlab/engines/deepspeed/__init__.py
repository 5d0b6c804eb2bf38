"""DeepSpeed ZeRO 1/2/3 with optimizer and parameter offload to CPU or NVMe (ZeRO-Infinity), ZenFlow and
SuperOffload: the adapter that trains, its JSON config, the planner's model, its swap buffers and its
placements. See engines/__init__.py for what each file holds."""
