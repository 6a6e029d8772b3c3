"""Published facts about models and hardware, read by the simulator, the real engines and telemetry.

:mod:`april_bench.profiles.models` holds model shapes (layers, heads, vocabulary,
parameter counts); :mod:`april_bench.profiles.hardware` holds GPU peaks and the
efficiencies a tuned engine reaches, each constant with its source.  Neither
imports an engine or the simulator.
"""
