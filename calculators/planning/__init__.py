"""Planning a deployment: $ per request and per 1M tokens (cost), the capacity planner's search over devices and
meshes (planner), and fitting MBU/MFU/overheads to measurements (calibration).
May import: specs and every other calculators folder. Never engine, server, ui.
"""
