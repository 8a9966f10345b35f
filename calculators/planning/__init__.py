"""Planning a deployment: $ per request and per 1M tokens (cost), the capacity planner's search over devices and
meshes (planner), maximum throughput (throughput), disaggregated prefill/decode sizing (disaggregated), the
cost-latency frontier (frontier), published serving figures vs predictions (published), and fitting
MBU/MFU/overheads to measurements (calibration).
May import: specs and every other calculators folder. Never engine, server, ui.
"""
