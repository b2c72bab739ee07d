"""Target devices: one description per GPU (``device``) and the one fit check (``fit``)."""

from pyrunner.target.device import DEVICES, DTYPE_BYTES, H200, Device

__all__ = ["DEVICES", "DTYPE_BYTES", "H200", "Device"]
