"""scripts/uv_install.py: pip's settings, as ``pip config list`` prints them, handed to uv."""

from __future__ import annotations

from tests.support.scripts import load_script

uv_install = load_script("uv_install.py")

# This machine's kind of configuration: /etc/pip.conf, /etc/xdg/pip/pip.conf and PIP_* variables.
CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/old.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/old-wheels'
install.index-url='https://mirror.example/simple'
"""


def test_pip_settings_take_the_variables_over_the_files():
    settings = uv_install.pip_settings(CONFIG_LIST)
    assert settings == {
        "cert": "/etc/ssl/certs/ca-certificates.crt",  # PIP_CERT over global.cert
        "default-timeout": "180",
        "find-links": "/opt/wheels",  # PIP_FIND_LINKS over global.find-links
        "constraint": "/etc/xdg/pip/constraints.txt",
        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
        "index-url": "https://mirror.example/simple",
    }


def test_uv_options_mean_what_the_pip_settings_mean():
    options = uv_install.uv_options(uv_install.pip_settings(CONFIG_LIST))
    assert options == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
    ]


def test_no_pip_settings_give_uv_its_defaults_and_pips_index_rule():
    assert uv_install.pip_settings("") == {}
    assert uv_install.uv_options({}) == ["--index-strategy", "unsafe-best-match"]
    # Lines that are not settings (pip's notes, blank lines) are skipped.
    assert uv_install.pip_settings("WARNING: something\n\nuser.unknown='x'\n") == {}
