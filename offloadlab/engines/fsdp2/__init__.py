"""PyTorch FSDP2 (`fully_shard`), with and without CPUOffloadPolicy and with torch's AdamW or DeepSpeed's CPU
Adam on the CPU shards: the adapter that trains, its Accelerate sections, the planner's model and its
placements. See engines/__init__.py for what each file holds."""
