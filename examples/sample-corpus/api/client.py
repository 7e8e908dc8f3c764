"""Minimal client for the Kestrel K2 local API (example, standard library only)."""

import json
import urllib.request

DEFAULT_PORT = 8765


def latest_readings(host, port=DEFAULT_PORT, timeout=5.0):
    """Return the latest readings of every sensor as a list of dicts."""
    with urllib.request.urlopen(f"http://{host}:{port}/v1/readings", timeout=timeout) as r:
        return json.load(r)["sensors"]


def dew_point(temp_c, humidity):
    """Magnus approximation of the dew point in degrees Celsius."""
    import math

    a, b = 17.62, 243.12
    gamma = math.log(humidity / 100.0) + a * temp_c / (b + temp_c)
    return b * gamma / (a - gamma)


if __name__ == "__main__":
    for sensor in latest_readings("192.168.1.50"):
        print(sensor["name"], sensor["temperature_c"], "°C")
