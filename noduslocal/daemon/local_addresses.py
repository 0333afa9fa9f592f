"""Which addresses are this host's own: loopback, link-local, unspecified, and those of its
interfaces. The daemon contacts none of them on a user's behalf (a sweep's webhook, an
image's registry) unless the admin allows it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
FIB_TRIE = "/proc/net/fib_trie"  # IPv4: each address an interface has is a "/32 host LOCAL"
IF_INET6 = "/proc/net/if_inet6"  # IPv6: one address an interface has per line


def parse(text: str) -> IPAddress | None:
    """An IP literal (IPv6 with or without brackets and zone) as a plain address; None
    for anything else, a name to resolve."""
    try:
        address = ipaddress.ip_address(text.strip("[]").partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 reaches 127.0.0.1
    return address


def host_addresses() -> set[IPAddress]:
    """Every address this host's interfaces have now (the docker bridge's too). Read each
    time: interfaces come and go."""
    found: set[IPAddress] = set()
    try:
        with open(FIB_TRIE) as trie:
            last = None
            for line in trie:
                words = line.split()
                if words[:1] == ["|--"]:
                    last = words[1]
                elif last is not None and words[:1] == ["/32"] and words[-1] == "LOCAL":
                    found.add(ipaddress.ip_address(last))
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(IF_INET6) as inet6:
            for line in inet6:
                found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    except (OSError, ValueError, IndexError):
        pass
    return found


def why_local(address: IPAddress) -> str | None:
    """What makes `address` this host's, as a phrase ("a loopback address"); None when it
    is another machine's."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified:
        return "the unspecified address, this host"
    if address in host_addresses():
        return "an address of this host"
    return None


def refused(address: IPAddress, allowed: Iterable[IPNetwork]) -> str | None:
    """Why the daemon may not contact `address` (why_local's phrase), or None: another
    machine's, or in one of the networks the admin `allowed`."""
    why = why_local(address)
    if why is None or any(address in network for network in allowed):
        return None
    return why


def resolve(host: str, port: int) -> list[IPAddress]:
    """`host` (a name or a literal) resolved as a connection to it would be: every
    address it has. Blocking; raises OSError (socket.gaierror) when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = [parse(str(info[4][0])) for info in infos]
    return [address for address in found if address is not None]
