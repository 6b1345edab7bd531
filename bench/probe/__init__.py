"""What machine is this, and how much VRAM its cards use: hardware.py (detection, the sweep
config for ``make bench``), vram.py (VRAM polling's public surface, over backends.py,
nvml.py, amd.py, opener.py and poller.py) and nodevram.py (per-node polling of multi-node runs).
"""
