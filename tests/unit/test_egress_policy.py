"""The egress policy (msgbus/egress.py): which addresses pushes may reach."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from msgbus.egress import EgressPolicy, EgressRefused
from msgbus.settings import PushSettings

REFUSED_BY_DEFAULT = {
    "169.254.169.254": "link-local",  # the cloud metadata address
    "fe80::1": "link-local",
    "127.0.0.1": "loopback",
    "::1": "loopback",
    "10.20.30.40": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "fd00::1": "unique-local",
    "100.64.0.1": "shared",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "::ffff:127.0.0.1": "loopback",  # an IPv4-mapped IPv6 address is its IPv4 address
    "::ffff:169.254.169.254": "link-local",
    "240.0.0.1": "reserved",
}
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"]


@pytest.mark.parametrize("address", list(REFUSED_BY_DEFAULT))
def test_an_internal_address_is_refused_by_default_with_its_kind(address: str) -> None:
    refusal = EgressPolicy().refusal(ipaddress.ip_address(address))
    assert refusal is not None and REFUSED_BY_DEFAULT[address] in refusal


@pytest.mark.parametrize("address", PUBLIC)
def test_a_public_address_is_allowed(address: str) -> None:
    assert EgressPolicy().refusal(ipaddress.ip_address(address)) is None


def test_allowed_networks_open_internal_ones_and_a_denial_wins() -> None:
    policy = EgressPolicy.parse("10.20.0.0/16, 127.0.0.1", "10.20.99.0/24,8.8.8.8")
    ip = ipaddress.ip_address
    assert policy.refusal(ip("10.20.30.40")) is None
    assert policy.refusal(ip("127.0.0.1")) is None
    assert policy.refusal(ip("::ffff:10.20.30.40")) is None
    assert policy.refusal(ip("10.21.0.1")) is not None  # outside the allowed network
    assert policy.refusal(ip("10.20.99.1")) == "in a denied network"
    assert policy.refusal(ip("8.8.8.8")) == "in a denied network"  # public, but denied


def test_a_network_that_does_not_parse_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"allow_networks.*'10\.0\.0\.0/33'"):
        PushSettings(allow_networks="10.0.0.0/33")
    with pytest.raises(ValueError, match=r"denied networks.*'nonsense'"):
        EgressPolicy.parse("", "nonsense")


def test_a_name_is_refused_when_it_resolves_only_to_refused_addresses() -> None:
    names = {"both.example": ["10.0.0.5", "93.184.216.34"], "inside.example": ["10.0.0.5"]}

    async def resolver(host: str, port: int) -> list[str]:
        return names[host]

    policy = EgressPolicy(resolver=resolver)

    async def check() -> None:
        assert await policy.addresses("both.example", 80) == ["93.184.216.34"]  # only that one
        with pytest.raises(EgressRefused, match=r"inside\.example is 10\.0\.0\.5, a private"):
            await policy.addresses("inside.example", 80)
        assert await policy.addresses("[2606:4700:4700::1111]", 443) == ["2606:4700:4700::1111"]
        refusal = await policy.url_refusal("http://169.254.169.254/latest/meta-data/")
        assert refusal is not None and "link-local" in refusal
        assert await policy.url_refusal("https://both.example/hook") is None

    asyncio.run(check())
