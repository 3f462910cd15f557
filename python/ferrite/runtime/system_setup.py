"""Finding drivers and devices by name, with per-process caches as upstream."""

import threading

from ._binding import HalDriver

_lock = threading.Lock()
_drivers = {}
_devices = {}


def query_available_drivers():
    """Names of the drivers this build offers."""
    return HalDriver.query()


def get_driver(device_uri: str) -> HalDriver:
    """The (cached) driver for a device URI such as `local-task`."""
    name = device_uri.split(":", 1)[0]
    with _lock:
        driver = _drivers.get(name)
        if driver is None:
            driver = HalDriver.create(name)
            _drivers[name] = driver
        return driver


def get_device(device_uri: str, cache: bool = True):
    """The (cached) default device for a device URI."""
    with _lock:
        if cache and device_uri in _devices:
            return _devices[device_uri]
    device = get_driver(device_uri).create_device_by_uri(device_uri)
    if cache:
        with _lock:
            device = _devices.setdefault(device_uri, device)
    return device


def get_first_device(device_uris=None, cache: bool = True):
    """The first device that can be created from `device_uris`."""
    uris = device_uris or query_available_drivers()
    last_error = None
    for uri in uris:
        try:
            return get_device(uri, cache=cache)
        except ValueError as e:
            last_error = e
    raise ValueError(f"Could not create any requested device {uris}") from last_error
