"""Slurm as an engine of the suite: ``alloc.py`` (the allocation the driver runs in, and the
rendezvous on its first node), ``steps.py`` (a run as a job step: finding it, ending it with
scancel), ``stop.py`` (the driver's clean stop on Slurm's signals, and the requeue),
``batch.py`` (the batch script) and ``submit.py`` (``python -m bench submit``). docs/multinode.md
"""
