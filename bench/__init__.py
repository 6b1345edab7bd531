"""A/B sweep driver for DFlash training: runs, VRAM polling, aggregation, reports."""
