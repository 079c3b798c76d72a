"""What a process tree listens on, for the tests that nothing binds beyond loopback."""

from __future__ import annotations

import ipaddress

import psutil


def loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if address.version == 6 and address.ipv4_mapped:  # ::ffff:127.0.0.1
        address = address.ipv4_mapped
    return address.is_loopback


def listening(procs: list[psutil.Process]) -> dict[tuple[str, int], str]:
    """(ip, port) -> process name of every listening TCP socket and bound UDP socket."""
    found = {}
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.laddr and (conn.status == psutil.CONN_LISTEN or not conn.raddr and
                                   conn.type == 2):  # SOCK_DGRAM
                    found[(conn.laddr.ip, conn.laddr.port)] = proc.name()
        except psutil.Error:
            continue
    return found
