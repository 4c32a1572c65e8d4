"""`hydra/launcher=parallel`: volt's launcher that runs the jobs of a sweep side by side, each in
a Python process of its own, on the CPU or one GPU (or group of GPUs) per job."""
