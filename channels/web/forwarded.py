"""Whether the browser talks https to us, behind a TLS-terminating proxy too.

`X-Forwarded-Proto` is honoured only when the connection comes from a trusted proxy
(`BUB_TRUSTED_PROXIES`, addresses or CIDRs). The default trusts loopback and the private
ranges (10/8, 172.16/12, 192.168/16, fc00::/7) where PaaS routers (Heroku, Render, Fly)
and a reverse proxy on the same host or network connect from; a client on the internet
cannot set the header for itself. `BUB_WEB_COOKIE_SECURE=true` says the public URL is https
whatever the headers say (a proxy on a public address).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from aiohttp import web

DEFAULT_TRUSTED_PROXIES = (
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_proxies(values: Iterable[str]) -> tuple[Network, ...]:
    """Networks from addresses or CIDRs (ValueError naming the bad one)."""
    found = []
    for value in values:
        text = value.strip()
        if not text:
            continue
        try:
            found.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"not an IP address or CIDR: {text!r}") from None
    return tuple(found)


class ForwardedProto:
    """Decides whether a request reached the public side over https."""

    def __init__(self, proxies: Iterable[str] = DEFAULT_TRUSTED_PROXIES, *, always: bool = False):
        self.proxies = parse_proxies(proxies)
        self.always = always

    def trusted(self, request: web.Request) -> bool:
        """Whether the peer of the connection is a trusted proxy."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if not peer:
            return False
        try:
            address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return any(address in network for network in self.proxies)

    def https(self, request: web.Request) -> bool:
        """True for TLS to us, for `X-Forwarded-Proto: https` from a trusted proxy (its
        nearest, last value), or when the operator says the public URL is https."""
        if self.always or request.secure:
            return True
        proto = request.headers.get("X-Forwarded-Proto", "")
        if not proto or not self.trusted(request):
            return False
        return proto.split(",")[-1].strip().lower() == "https"


__all__ = ["DEFAULT_TRUSTED_PROXIES", "ForwardedProto", "parse_proxies"]
