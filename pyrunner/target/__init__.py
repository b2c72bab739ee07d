"""Target devices: one description per GPU (``device``), the one fit check (``fit``) and what TileLang
makes of a plan on it (``layout``). Read by the planner (cost, tile choice) and the runner (fit).
"""

from pyrunner.target.device import DEFAULT_TARGET, DEVICES, DTYPE_BYTES, Device, device_named

__all__ = ["DEFAULT_TARGET", "DEVICES", "DTYPE_BYTES", "Device", "device_named"]
