"""The address guard for web_fetch: the model may only make us fetch from the public internet.

A URL the model (or a page it read) hands us could point at this machine, the LAN or a cloud
metadata service. So every host is resolved, and the request goes ahead only if *every*
address is public unicast. The check happens inside the connector's resolver, and the
connection is made to exactly the addresses that were vetted, so a DNS answer that changes
between check and connect (rebinding) gains nothing. aiohttp skips the resolver for IP-literal
hosts, so ``check_url`` vets literals itself, including the legacy IPv4 spellings
(``2130706433``, ``0x7f.1``, ``0177.0.0.1``) that socket functions still accept.
"""

from __future__ import annotations

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Exact (address, port) pairs that may be fetched although not public: the owner's
# ``tools.web.fetch.allowPrivate`` (a LAN service). One port each, so a redirect elsewhere fails.
Allowed = frozenset[tuple[str, int]]
NONE_ALLOWED: Allowed = frozenset()

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d form


class BlockedAddressError(PermissionError):
    """The URL's host is, or resolves to, an address we refuse to connect to."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address tunnels to, if any (the host may route it there)."""
    if ip.ipv4_mapped:
        return ip.ipv4_mapped
    if ip in _NAT64 or ip in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def is_public(ip: IPAddress) -> bool:
    """Global unicast, looking through IPv4-in-IPv6 wrappings (``::ffff:127.0.0.1``)."""
    if isinstance(ip, ipaddress.IPv6Address) and (inner := _embedded_ipv4(ip)) is not None:
        ip = inner
    return ip.is_global and not ip.is_multicast


def check_address(ip: IPAddress | str, port: int, host: str, allowed: Allowed = NONE_ALLOWED) -> None:
    """Raise BlockedAddressError unless ``ip`` is public (or ``allowed`` with this port)."""
    ip = ipaddress.ip_address(ip)
    if (str(ip), port) in allowed or is_public(ip):
        return
    shown = host if host == str(ip) else f"{host} ({ip})"
    raise BlockedAddressError(f"refusing to fetch {shown}: not a public internet address")


def literal_ip(host: str) -> IPAddress | None:
    """The address an IP-literal host denotes, in any spelling the C library would accept."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:  # inet_aton takes decimal, octal, hex and short forms: 2130706433, 0x7f.1, 127.1
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_url(url: str | URL, allowed: Allowed = NONE_ALLOWED) -> URL:
    """Parse and vet a URL before any connection: http(s) only, no non-public IP literal."""
    try:
        parsed = URL(url) if isinstance(url, str) else url
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid URL {url!s}: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"only http and https URLs can be fetched, not {parsed.scheme or 'a relative URL'!r}")
    host = parsed.raw_host
    if not host:
        raise ValueError(f"URL has no host: {url!s}")
    if (ip := literal_ip(host)) is not None:
        check_address(ip, parsed.port or 0, host, allowed)
        if isinstance(ip, ipaddress.IPv4Address) and host != str(ip):
            # aiohttp refuses these spellings anyway; say plainly why.
            raise ValueError(f"unusual IPv4 spelling {host!r}; write it as {ip}")
    return parsed


class GuardedResolver(AbstractResolver):
    """Resolve with the system resolver, then refuse unless every address is public.

    aiohttp connects only to the addresses this returns, so what was checked is what is used.
    """

    def __init__(self, allowed: Allowed = NONE_ALLOWED) -> None:
        self._inner = ThreadedResolver()
        self._allowed = allowed

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            check_address(result["host"], port, host, self._allowed)
        return results

    async def close(self) -> None:
        await self._inner.close()
