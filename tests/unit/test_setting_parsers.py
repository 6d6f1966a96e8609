"""Every declared setting's parser is total: whatever text it is given (Unicode digits and
spaces, signs, exponents, numbers past Python's 4,300-digit limit, control characters, NUL,
lone surrogates, JSON of any shape), it returns a value that reads back the same, or refuses
with a SettingError whose message names the setting, shows the value (escaped, shortened)
and says what is valid; never another exception. Through the CLI, a refusal is exit 2 with
no traceback. No TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from entrypoint.app import app
from mgpu_env.config.parsers import SettingError
from mgpu_env.config.resolve import setting_error_message
from mgpu_env.config.settings import DECLARATIONS, Declaration
from mgpu_env.config.text import SHOWN_CHARACTERS, shown
from tests.support.children import REPO, child_env

# Characters Python's readers take in numbers or strip as spaces, though a setting should not
# read them as its own: digits of other scripts (Arabic-Indic, Devanagari, fullwidth),
# superscripts and circled digits (isdigit, not int), Unicode spaces and separators.
DIGITS = "0123456789\u0663\u0660\u0967\uff13\u00b2\u00b3\u00b9\u2460\U0001d7d5"
SPACES = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u200b\u2028\u2029\u3000\ufeff"
SIGNS = "+-\u2212_.,eE"  # \u2212: the minus sign
UNITS = ["", "s", "m", "h", "S", "d", "ms", "%"]
CONTROL = "\x00\x01\x07\x1b\x7f\x9b"
SURROGATES = "\ud800\udc80\udcff\udfff"  # \udc80-\udcff: non-UTF-8 bytes (surrogateescape)
WORDS = ["nan", "inf", "-inf", "Infinity", "epoch", "auto", "all", "none", "cpu", "true",
         "GPU-", "MIG-", "mlp", "digits", "npy:", "tfrecord:", "images:", "a.b:c", "~", "/",
         ".", "..", "localhost:", "w0:2222"]


def number_like() -> st.SearchStrategy[str]:
    """Text shaped like a number, put together from the parts a parser splits."""
    piece = st.one_of(st.text(st.sampled_from(DIGITS), max_size=8), st.sampled_from(SIGNS),
                      st.text(st.sampled_from(SPACES), max_size=2), st.sampled_from(WORDS),
                      st.sampled_from(UNITS), st.sampled_from(CONTROL + SURROGATES))
    return st.lists(piece, max_size=6).map("".join)


def huge() -> st.SearchStrategy[str]:
    """Numbers around and past Python's 4,300-digit limit on int(), bare or with a unit,
    a sign, a decimal point, a comma list or a host's port."""
    digits = st.builds(lambda n, d: d * n, st.integers(4_290, 12_000), st.sampled_from("159"))
    return st.builds(lambda pre, body, post: pre + body + post,
                     st.sampled_from(["", "-", "+", "0.", "1e", "0,", "w0:", " "]), digits,
                     st.sampled_from(["", "s", "m", ".5", ",1", "e3", " "]))


def json_like() -> st.SearchStrategy[str]:
    """JSON of any shape, and TF_CONFIG's own shape with values of any type in it."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                       st.text(max_size=8), st.sampled_from(["chief", "worker", "ps", "a:1"]))
    anything = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                            max_leaves=8)
    shaped = st.fixed_dictionaries({
        "cluster": st.one_of(anything, st.dictionaries(
            st.sampled_from(["chief", "master", "worker", "ps", ""]),
            st.one_of(anything, st.lists(st.one_of(st.sampled_from(["a:1", "b:2", "c:99999"]),
                                                   anything), max_size=3)), max_size=3)),
        "task": st.one_of(anything, st.fixed_dictionaries(
            {"type": st.one_of(anything, st.sampled_from(["worker", "chief"])),
             "index": st.one_of(anything, st.integers(-2, 3))})),
    })
    deep = st.integers(1_000, 50_000).map(lambda n: "[" * n + "]" * n)
    return st.one_of(anything.map(json.dumps), shaped.map(json.dumps), deep)


ANY_TEXT = st.one_of(
    st.text(st.characters(codec=None, categories=None), max_size=30),  # any code point
    number_like(), huge(), json_like(),
    st.text(st.sampled_from(DIGITS + SPACES + SIGNS + CONTROL + SURROGATES), max_size=12),
)

# The values the issue names, and their neighbours: tried on every setting as well.
KNOWN = ["", " ", "\x00", "1\x00", "\u0663", "\u00b2", "\uff13", "1_000", "1e3", "-0", "+5",
         "nan", "inf", "1e999", "\u3000", "\u30001\u3000", "\ud800", "\udcff",
         "9" * 4301, "9" * 4301 + "s",
         "0" * 5000 + "7", "1" * 300, "a" * 5000, "~nosuchuser/x", "x" * 300 + "/y",
         "[" * 5000 + "]" * 5000, '{"cluster": {"worker": ["a:1"]}, "task": {"type": [], '
         '"index": 0}}', '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", '
         '"index": true}}', '{"cluster": {"worker": [1]}, "task": {"type": "worker", '
         '"index": 0}}']

BY_NAME = pytest.mark.parametrize("declaration", DECLARATIONS, ids=lambda d: d.env)


def as_text(value: Any) -> str:
    """A parsed value written back as a setting's text (as `Settings.as_text` does)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def check(declaration: Declaration, text: str) -> str:
    """Parse `text` as the setting; a value must read back the same, a refusal must say what
    the issue asks. Returns "accepted" or "refused"."""
    try:
        value = declaration.parse(text)
    except SettingError as err:
        message = setting_error_message(declaration, text, "the environment", str(err))
        assert message.startswith(f"Bad setting {declaration.env}={shown(text)} ")
        assert f"Valid: {declaration.valid}." in message
        # Printable, short and encodable whatever the value held.
        message.encode("utf-8")
        assert all(line.isprintable() for line in message.splitlines()), message
        assert len(message) < 4 * SHOWN_CHARACTERS + len(declaration.valid) + 300, message
        return "refused"
    assert declaration.parse(as_text(value)) == value, (text, value)
    if not isinstance(value, (str, Path)) and value is not None:
        # Numbers, lists and intervals are written in ASCII: '٣' is not three here.
        assert text.strip().isascii(), (text, value)
    return "accepted"


# Generated texts per setting: enough for the suite to meet every kind above in seconds;
# FUZZ_EXAMPLES=5000 (and a random seed each run) for a long search.
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "80"))


@BY_NAME
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize="FUZZ_EXAMPLES" not in os.environ,
          database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=ANY_TEXT)
def test_every_setting_accepts_or_refuses_any_text_cleanly(
    declaration: Declaration, text: str
) -> None:
    check(declaration, text)


@BY_NAME
def test_every_setting_takes_the_known_hard_values_cleanly(declaration: Declaration) -> None:
    outcomes = {text: check(declaration, text) for text in KNOWN}
    assert set(outcomes.values()) <= {"accepted", "refused"}


# Arabic-Indic 3, superscript 2, fullwidth 3, Devanagari 10, bold 7, circled 1.
NOT_ASCII_NUMBERS = ["\u0663", "\u00b2", "\uff13", "1_000", "nan", "inf", "\u0967\u0966",
                     "\U0001d7d5", "\u2460"]


@pytest.mark.parametrize("declaration", [d for d in DECLARATIONS if isinstance(
    d.parse(d.default), (int, float)) and not isinstance(d.parse(d.default), bool)],
    ids=lambda d: d.env)
def test_numbers_are_written_in_the_digits_0_to_9(declaration: Declaration) -> None:
    assert {text: check(declaration, text) for text in NOT_ASCII_NUMBERS} == dict.fromkeys(
        NOT_ASCII_NUMBERS, "refused")


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--epochs", "²"], {}, "EPOCHS='²'"),
    (["--epochs", "1\x00"], {}, "EPOCHS='1\\x00'"),
    ([], {"CHECKPOINT_EVERY": "\u0663"}, "CHECKPOINT_EVERY='\u0663'"),
    ([], {"CHECKPOINT_EVERY": "9" * 5000}, "CHECKPOINT_EVERY='999"),
    ([], {"BATCH_SIZE": "\uff16\uff14"}, "BATCH_SIZE='\uff16\uff14'"),
    ([], {"GPUS": "0,²"}, "GPUS='0,²'"),
    ([], {"WORKER_HOSTS": "a:" + "1" * 5000}, "(5,002 characters)"),
    ([], {"TF_CONFIG": "[" * 5000}, "TF_CONFIG='[[["),
    ([], {"SEED": "\udcff"}, "SEED='\\udcff'"),
    ([], {"LEARNING_RATE": "\u0661.\u0665"}, "LEARNING_RATE='\u0661.\u0665'"),
])
def test_a_bad_value_through_the_cli_is_exit_2_with_no_traceback(
    args: list[str], env: dict[str, str], named: str
) -> None:
    result = CliRunner().invoke(app, ["train", "--dry-run", *args], env=env)
    assert result.exit_code == 2, result.output
    assert named in result.stderr and "Valid:" in result.stderr
    assert "Traceback" not in result.output and len(result.stderr) < 2000


def test_undecodable_bytes_in_the_environment_are_exit_2_in_a_real_process(
    tmp_path: Path
) -> None:
    # Bytes that are not UTF-8 reach Python as lone surrogates; the message must still print.
    env = {k.encode(): v.encode() for k, v in child_env(tmp_path).items()}
    env[b"EPOCHS"] = b"\xff\xfe3"
    result = subprocess.run([sys.executable, "-m", "entrypoint", "train", "--dry-run"],
                            env=env, cwd=REPO, capture_output=True, timeout=120, check=False)
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert "EPOCHS='\\udcff\\udcfe3'" in stderr and "Traceback" not in stderr
