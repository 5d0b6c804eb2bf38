"""torchao's CPUOffloadOptimizer on one GPU (DeepSpeed's CPU Adam or torch's fused AdamW stepping each
parameter on the CPU): the adapter that trains, its Accelerate section, the planner's model and its
placement. See engines/__init__.py for what each file holds."""
