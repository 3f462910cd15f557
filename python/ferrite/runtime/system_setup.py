"""Finding drivers and devices by name, with per-process caches as upstream."""

import logging
import os
import threading
from typing import Collection, Optional, Sequence

from ._binding import HalDevice, HalDriver, get_cached_hal_driver

_lock = threading.RLock()
_devices = {}

# Tried in order by `get_first_device()` when neither an argument nor
# `IREE_DEFAULT_DEVICE` names devices; unknown drivers are skipped.
DEFAULT_DRIVER_NAMES = "local-task,cuda,vulkan"


def query_available_drivers() -> Collection[str]:
    """Names of the drivers this build offers."""
    return HalDriver.query()


def get_driver(device_uri: str) -> HalDriver:
    """The (cached) driver for a device URI such as `local-task`."""
    return get_cached_hal_driver(device_uri)


def get_device(device_uri: str, cache: bool = True) -> HalDevice:
    """The (cached) default device for a device URI."""
    with _lock:
        if cache and device_uri in _devices:
            return _devices[device_uri]
        device = get_driver(device_uri).create_device_by_uri(device_uri)
        if cache:
            _devices[device_uri] = device
        return device


def get_first_device(device_uris: Optional[Sequence[str]] = None, cache: bool = True) -> HalDevice:
    """The first device that can be created from `device_uris`.

    Without `device_uris`, the comma-separated `IREE_DEFAULT_DEVICE`
    environment variable, else `DEFAULT_DRIVER_NAMES`. Unknown drivers are
    skipped; when a known one fails, the last failure is raised as the cause
    of a RuntimeError, and a ValueError when none was known.
    """
    if device_uris is None:
        names = os.environ.get("IREE_DEFAULT_DEVICE", DEFAULT_DRIVER_NAMES)
        device_uris = [s.strip() for s in names.split(",")]
    last_error = None
    for uri in device_uris:
        try:
            return get_device(uri, cache=cache)
        except ValueError:
            continue  # no such driver
        except Exception as e:
            logging.info(f"Failed to create device {uri}: {e}")
            last_error = e
    if last_error is not None:
        raise RuntimeError("Could not create device. Exception for last tried follows.") from last_error
    raise ValueError(f"No device found from list {device_uris}")
