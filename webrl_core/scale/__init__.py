"""Scaling out: training under ``accelerate launch`` (DDP, FSDP, DeepSpeed ZeRO-3) and rollouts on a Ray cluster.

    launch       the critic, actor, SFT and ORM trainers in-process or as ``accelerate launch`` jobs
    ray_rollout  rollout shards as Ray tasks, each node storing its episodes, with a shared policy server
    ray_cluster  the local Ray cluster: ``ray start`` processes on this machine's loopback addresses
    processes    process trees on psutil (what the CLI and the fault harness stop; no stage imports it)
"""
