"""Admin keys: ``--admin-api-key`` (and ``BATCHING_ADMIN_API_KEY``), ``--admin-api-key-file``
(and ``BATCHING_ADMIN_API_KEY_FILE``), read as the API keys are, and what a credential may do
with both sets (:class:`batching.keys.AccessKeys`): pass the doors, load and unload. The doors
themselves are tested on a real server in ``test_model_control_access.py``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from batching import ModelConfig, create_app
from batching.control import ControlOptions
from batching.keys import AccessKeys, ApiKeyError, ApiKeys
from batching.settings.cli import parse_settings
from tests.support.asgi import serving

USER = "sk-user-1"
ADMIN = "sk-admin-1"


def admin_keys(*keys: str) -> ApiKeys:
    return ApiKeys(list(keys), flag="--admin-api-key")


def test_admin_keys_come_from_the_flags_the_variables_and_a_file(tmp_path: Path) -> None:
    settings = parse_settings(["--admin-api-key", "a1", "--admin-api-key", "b2"], {})
    assert settings.admin_keys is not None and settings.admin_keys.count == 2
    assert settings.api_keys is None
    settings = parse_settings([], {"BATCHING_ADMIN_API_KEY": "a1, b2,c3"})
    assert settings.admin_keys is not None and settings.admin_keys.count == 3
    file = tmp_path / "admin-keys"
    file.write_text("f1\nf2\n")
    settings = parse_settings(["--api-key", USER], {"BATCHING_ADMIN_API_KEY_FILE": str(file)})
    assert settings.admin_keys is not None and settings.admin_keys.accepts("f2")
    assert settings.api_keys is not None and not settings.api_keys.accepts("f2")
    assert parse_settings([], {}).admin_keys is None


def test_an_admin_key_that_is_also_an_api_key_stops_the_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "keys"
    file.write_text(f"{USER}\nsk-other\n")
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--api-key-file", str(file), "--admin-api-key", USER], {})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("server.py: error: --admin-api-key: a key is also an API key")
    assert err.count("\n") == 1 and USER not in err


def test_an_empty_admin_key_file_is_named_by_its_own_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "admin-keys"
    file.write_text("\n")
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--admin-api-key-file", str(file)], {})
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"server.py: error: --admin-api-key-file {file}: holds no key (one key per line)\n"
    )
    with pytest.raises(ApiKeyError, match="--admin-api-key: give at least one key"):
        admin_keys()


def test_both_kinds_of_key_pass_the_doors_and_only_an_admin_key_may_load() -> None:
    keys = AccessKeys(api=ApiKeys([USER]), admin=admin_keys(ADMIN))
    assert keys.accepts(USER) and keys.accepts(ADMIN)
    assert not keys.accepts("sk-wrong") and not keys.accepts(None) and not keys.accepts("")
    assert keys.control_refusal(ADMIN) is None
    assert "presents a key that is not one" in str(keys.control_refusal(USER))
    assert "presents no key" in str(keys.control_refusal(None))


def test_without_admin_keys_a_keyed_server_lets_no_one_load_and_an_unkeyed_one_everyone() -> None:
    keyed = AccessKeys(api=ApiKeys([USER]))
    assert "this server has none" in str(keyed.control_refusal(USER))
    assert "(set --admin-api-key" not in str(keyed.control_warning())
    assert "load and unload calls are refused" in str(keyed.control_warning())
    unkeyed = AccessKeys()
    assert unkeyed.control_refusal(None) is None
    assert "anyone who reaches its port may load and unload" in str(unkeyed.control_warning())
    assert AccessKeys(admin=admin_keys(ADMIN)).control_warning() is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({"api_keys": ApiKeys([USER])}, "load and unload calls are refused"),
        ({}, "anyone who reaches its port may load and unload models"),
    ],
)
async def test_explicit_mode_says_at_start_when_everyone_or_no_one_may_load(
    keys: dict[str, ApiKeys], says: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(
        ModelConfig(name="m", source="tests.support.versions:VersionOne"),
        model_control=ControlOptions(mode="explicit"),
        **keys,
    )
    with caplog.at_level(logging.WARNING, logger="batching"):
        async with serving(app, wait_ready=False):
            pass
    assert "model control: " in caplog.text and says in caplog.text
