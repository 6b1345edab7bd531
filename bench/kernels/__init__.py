"""The kernel attribution (``python -m bench kernels``, docs/kernels.md). One concern per
module; each imports only the ones above it in this list (this file imports nothing, so
``from bench.kernels import x`` never closes a cycle):

    roofline  bytes, FLOPs and the roofline, by formula
    bridge    every name taken from bench.config / run / procs / probe / results
    timing    the Timer and the device's measured limits
    shapes    the draft's sites and shapes, the cell plan        (roofline, bridge)
    modules   the only importer of specforge: plan_cell, the stock / Liger modules (shapes, bridge)
    cell      measure_cell: one cell's rows of kernels.csv        (roofline, shapes, timing, modules)
    predict   predicted vs measured step saving per Liger arm     (roofline, shapes; bench.arms)
    report    kernels.md, kernels.png, kernels.csv                (bridge, timing, shapes, cell, predict)
    buckets   --profile: the profile runs and the bucket tables   (bridge, shapes, modules; bench.arms)
    cli       run_kernels, rebuild_kernels: the command           (all of the above)
    measure   a re-export of cli.run_kernels for bench/__main__.py
"""
