"""Which addresses `web.fetch` may reach (SSRF guard).

A URL passes `check_url` (http or https, no user-info, a host written plainly), then
`pin` resolves its host once and checks every address it got: loopback, private, link-local,
CGNAT, multicast, reserved and cloud-metadata addresses are refused, also written as
IPv4-mapped or -compatible IPv6, and ports other than 80 and 443. `BUB_FETCH_ALLOW`
(`Allowance`) lets an operator reach such addresses and ports on purpose. The caller then
connects to the returned address only (no second resolution), and does all this again at
every redirect.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""`await resolver(host, port)`: the host's addresses as strings (raises OSError)."""

STANDARD_PORTS = frozenset({80, 443})
ALLOW_SETTING = "BUB_FETCH_ALLOW"


class Refused(Exception):
    """A URL or address web.fetch will not reach; the message says why (for the model)."""


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), label) for net, label in pairs)


METADATA = "cloud metadata"
# First match names the reason. Metadata first: 169.254.169.254 is link-local too, but
# only an IP or CIDR entry of BUB_FETCH_ALLOW unlocks it (never a host name's DNS answer).
BLOCKED = _nets(
    ("169.254.169.254/32", METADATA),  # AWS, GCP, Azure, OpenStack, DigitalOcean…
    ("169.254.170.2/32", METADATA),  # ECS task credentials
    ("168.63.129.16/32", METADATA),  # Azure wire server
    ("100.100.100.200/32", METADATA),  # Alibaba Cloud
    ("192.0.0.192/32", METADATA),  # Oracle Cloud
    ("fd00:ec2::254/128", METADATA),  # AWS over IPv6
    ("0.0.0.0/8", "unspecified"),  # 0.0.0.0 reaches this host
    ("127.0.0.0/8", "loopback"),
    ("10.0.0.0/8", "private"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "CGNAT (shared)"),  # carrier NAT, Tailscale
    ("169.254.0.0/16", "link-local"),
    ("192.0.0.0/24", "reserved"),
    ("192.0.2.0/24", "reserved"),
    ("198.18.0.0/15", "reserved"),  # benchmarking; fake-IP proxies hand these out
    ("198.51.100.0/24", "reserved"),
    ("203.0.113.0/24", "reserved"),
    ("192.88.99.0/24", "reserved"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),  # and 255.255.255.255
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "reserved"),  # IPv4-compatible (deprecated): checked as IPv4 first
    ("64:ff9b:1::/48", "private"),  # local-use NAT64
    ("100::/64", "reserved"),  # discard-only
    ("2001::/23", "reserved"),  # IETF protocol assignments, Teredo
    ("2001:db8::/32", "reserved"),
    ("fc00::/7", "private"),  # unique local
    ("fe80::/10", "link-local"),
    ("fec0::/10", "link-local"),  # site-local (deprecated)
    ("ff00::/8", "multicast"),
)
_COMPAT = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip in _COMPAT and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "IPv4-compatible"
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    return None


def blocked(ip: IPAddress) -> str | None:
    """Why `ip` is not a public address web.fetch may reach by default, or None."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "link-local"
        inner = _embedded_v4(ip)
        if inner is not None:
            reason = blocked(inner[0])
            if reason is not None:
                return f"{reason} ({inner[1]} IPv6)"
            if inner[1] != "IPv4-compatible":
                return None  # a public IPv4 address reached over IPv6
    for network, label in BLOCKED:
        if ip.version == network.version and ip in network:
            return label
    if ip.is_multicast:
        return "multicast"
    if not ip.is_global:
        return "non-public"  # whatever Python's registry knows that the table does not
    return None


def _plain(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as its IPv4 address (allow entries match either form)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One `BUB_FETCH_ALLOW` entry: a host name (`*.suffix` for its subdomains) or an IP
    network, and its ports (None: any; unset in the entry: 80 and 443)."""

    text: str
    host: str | None
    network: IPNetwork | None
    ports: frozenset[int] | None

    def matches(self, host: str, ip: IPAddress, port: int | None, *, metadata: bool) -> bool:
        """The entry allows `ip` of `host` on `port` (None: on some port)."""
        if self.ports is not None and port is not None and port not in self.ports:
            return False
        if self.network is not None:
            plain = _plain(ip)
            return plain.version == self.network.version and plain in self.network
        if metadata or self.host is None:
            return False  # a name's DNS answer never unlocks a metadata address
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host


def _host_name(host: str) -> str:
    """A host name as compared: lower case, IDNA (punycode), no trailing dot."""
    name = host.strip().rstrip(".").lower()
    if not name:
        raise ValueError("empty host")
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"{host!r} is not a host name") from None


def _parse_entry(text: str) -> AllowEntry:
    raw = text.strip()
    bad = (
        f"{ALLOW_SETTING}: {raw!r} is not a host, IP address or CIDR (optionally followed by"
        " :port or :*; IPv6 with a port in brackets: [fd00::/8]:8080)"
    )
    where, ports_text = raw, None
    if raw.startswith("["):
        inside, _, rest = raw[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(bad)
        where, ports_text = inside, (rest[1:] if rest else None)
    elif raw.count(":") == 1:
        where, ports_text = raw.split(":")
    ports: frozenset[int] | None = STANDARD_PORTS
    if ports_text is not None:
        if ports_text == "*":
            ports = None
        elif ports_text.isdigit() and 0 < int(ports_text) < 65536:
            ports = frozenset({int(ports_text)})
        else:
            raise ValueError(bad)
    try:
        network = ipaddress.ip_network(where, strict=False)
    except ValueError:
        network = None
    if network is not None:
        if isinstance(network, ipaddress.IPv6Network) and network.prefixlen == 128:
            mapped = network.network_address.ipv4_mapped
            if mapped is not None:
                network = ipaddress.ip_network(mapped)
        return AllowEntry(raw, None, network, ports)
    wildcard = where.startswith("*.")
    try:
        name = _host_name(where[2:] if wildcard else where)
    except ValueError:
        raise ValueError(bad) from None
    if not all(
        part and (part.replace("-", "").replace("_", "").isalnum()) for part in name.split(".")
    ):
        raise ValueError(bad)
    return AllowEntry(raw, ("*." + name) if wildcard else name, None, ports)


@dataclass(frozen=True, slots=True)
class Allowance:
    """What `BUB_FETCH_ALLOW` lets web.fetch reach beyond public addresses on 80 and 443."""

    entries: tuple[AllowEntry, ...] = ()

    @classmethod
    def parse(cls, values: Iterable[str]) -> Allowance:
        """Entries such as `127.0.0.1:8123`, `10.0.0.0/8`, `wiki.internal`, `*.corp:*`;
        raises ValueError naming the bad one."""
        return cls(tuple(_parse_entry(v) for v in values if v.strip()))

    def covers(self, host: str, ip: IPAddress, port: int | None, *, metadata: bool = False) -> bool:
        """An entry allows `ip` (of `host`) on `port` (None: on some port)."""
        return any(e.matches(host, ip, port, metadata=metadata) for e in self.entries)


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (getaddrinfo, in a thread)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _non_standard_ipv4(host: str) -> str | None:
    """The dotted quad a numeric host like `2130706433`, `0177.0.0.1` or `127.1` means to
    the C resolver (and to browsers), or None when it is not one."""
    if not host or not all(c in "0123456789abcdefx." for c in host.lower()):
        return None
    if not host[0].isdigit():
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def check_url(url: str | URL, *, redirect: bool = False) -> URL:
    """`url` parsed once (the same object is then requested, so the check and the client
    never read it differently); raises Refused for what web.fetch never requests."""
    what = "redirect to" if redirect else "URL"
    try:
        parsed = url if isinstance(url, URL) else URL(url.strip())
    except (ValueError, TypeError) as exc:
        raise Refused(f"not a valid {what}: {str(url)!r} ({exc})") from None
    scheme = (parsed.scheme or "").lower()
    if scheme not in ("http", "https"):
        shown = f"{scheme}:" if scheme else "a relative URL"
        raise Refused(f"only http and https URLs can be fetched ({what} {str(url)!r} is {shown})")
    authority = parsed.raw_authority or ""
    if "@" in authority:
        raise Refused(
            f"{what} {str(url)!r} has user-info (user:password@): web.fetch never sends credentials"
        )
    host = parsed.raw_host or ""
    if not host:
        raise Refused(f"{what} {str(url)!r} has no host")
    if "%" in host:
        raise Refused(f"{what} {str(url)!r}: IPv6 zone ids are not allowed")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        meant = _non_standard_ipv4(host)
        if meant is not None:
            raise Refused(
                f"{what} {str(url)!r}: {host!r} is the IP address {meant} written in a"
                " non-standard form; write it as a plain dotted address"
            ) from None
    return parsed.with_fragment(None)


async def pin(url: URL, allow: Allowance, resolver: Resolver) -> str:
    """Resolve `url`'s host once and return the address to connect to; raises Refused
    when any address it resolves to is not allowed (the address first: it is the reason
    that matters), or the port."""
    try:
        literal: IPAddress | None = ipaddress.ip_address(url.raw_host or "")
    except ValueError:
        literal = None
    host = str(literal) if literal is not None else _host_name(url.raw_host or "")
    port = url.port or (443 if url.scheme == "https" else 80)
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise Refused(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise Refused(f"cannot resolve {host}: no addresses")
    checked: list[tuple[IPAddress, bool]] = []
    for text in addresses:  # every address first: one bad address refuses the name
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise Refused(f"{host} resolved to {text!r}, which is not an IP address") from None
        reason = blocked(ip)
        metadata = reason is not None and METADATA in reason
        allowed = allow.covers(host, ip, port, metadata=metadata)
        if reason is not None and not allowed:
            if allow.covers(host, ip, None, metadata=metadata):
                raise Refused(_port_refused(host, port))  # allowed, on other ports
            named = "" if literal is not None else f"{host} resolves to "
            article = "an" if reason[0] in "aeiou" else "a"
            raise Refused(
                f"refused: {named}{ip}, {article} {reason} address; web.fetch reaches only"
                f" public addresses unless the operator allows this one ({ALLOW_SETTING})"
            )
        checked.append((ip, allowed))
    if port not in STANDARD_PORTS and not all(allowed for _, allowed in checked):
        raise Refused(_port_refused(host, port))
    return addresses[0]


def _port_refused(host: str, port: int) -> str:
    return (
        f"refused: port {port} of {host}; web.fetch uses ports 80 and 443 unless the operator"
        f" allows another ({ALLOW_SETTING})"
    )


__all__ = [
    "ALLOW_SETTING",
    "BLOCKED",
    "AllowEntry",
    "Allowance",
    "Refused",
    "Resolver",
    "blocked",
    "check_url",
    "pin",
    "system_resolver",
]
