"""Converters from the public formats, on small files written here and on the real Azure trace."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from traces.io import TraceError, load_trace
from traces.tools import rate_per_window, summary

TRACES = os.environ.get("LLMSIM_TRACES")  # a folder of known public traces, laid out like their sources
AZURE_CONV_2023 = Path(TRACES) / "azure2023" / "AzureLLMInferenceTrace_conv.csv" if TRACES else None


def write(tmp_path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_keeps_seven_digit_fractions_and_rebases_to_first_request(tmp_path):
    path = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                                        "2023-11-16 18:15:46.6805900,374,44\r\n"
                                        "2023-11-16 18:15:46.6805901,396,109\r\n"
                                        "2023-11-16 18:16:00.0000000,879,55\r\n")
    trace = load_trace(path)
    assert trace.arrival_s[0] == 0.0
    assert trace.arrival_s[1] == pytest.approx(1e-7, abs=1e-12)  # the 100 ns digit survives
    assert trace.arrival_s[2] == pytest.approx(13.31941, abs=1e-9)
    assert trace.prompt_tokens.tolist() == [374, 396, 879]
    assert trace.output_tokens.tolist() == [44, 109, 55]


def test_azure_2024_style_offsets_and_short_fractions_parse(tmp_path):
    path = write(tmp_path, "a24.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2024-05-10 00:00:00.009930+00:00,2162,5\n"
                                      "2024-05-10 00:00:01+00:00,2399,6\n")
    assert load_trace(path, fmt="azure").arrival_s.tolist() == pytest.approx([0.0, 0.99007])


def test_azure_sorts_out_of_order_rows_and_counts_them(tmp_path):
    path = write(tmp_path, "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        "2023-11-16 18:00:02.0000000,2,2\n"
                                        "2023-11-16 18:00:01.0000000,1,1\n"
                                        "2023-11-16 18:00:03.0000000,3,3\n")
    trace = load_trace(path)
    assert trace.prompt_tokens.tolist() == [1, 2, 3]
    assert trace.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert trace.notes["out_of_order"] == 1


def test_burstgpt_drops_failed_requests_and_counts_them(tmp_path):
    path = write(tmp_path, "burst.csv",
                 "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n"
                 "45,ChatGPT,1087,0,1087,Conversation log\n"
                 "118,GPT-4,417,276,693,API log\n"
                 "130,ChatGPT,20,0,20,API log\n")
    trace = load_trace(path)
    assert trace.notes["dropped_failed"] == 2
    assert trace.arrival_s.tolist() == [0.0, 113.0]
    assert trace.prompt_tokens.tolist() == [472, 417]
    assert trace.output_tokens.tolist() == [18, 276]


def test_mooncake_keeps_hash_ids_as_block_hashes_and_converts_ms(tmp_path):
    rows = [{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]},
            {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 2366]}]
    path = write(tmp_path, "mc.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 3.053])
    assert trace.prompt_tokens.tolist() == [6955, 6472]
    assert trace.block_hashes == [[46, 47, 2353], [46, 47, 2366]]


BAD_PUBLIC_FILES = {
    "azure unparsable timestamp": ("a.csv", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2023-11-16 18:15:46.6805900,1,1\nyesterday,1,1\n", 3, "not a date"),
    "azure negative length": ("a.csv", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                              "2023-11-16 18:15:46.6805900,-3,1\n", 2, "ContextTokens is negative"),
    "azure wrong columns": ("a.csv", "azure", "TIMESTAMP,Context,Generated\n2023-11-16 18:15:46,1,1\n",
                            1, "missing column 'ContextTokens'"),
    "azure empty": ("a.csv", "azure", "", 1, "empty"),
    "burstgpt fractional": ("b.csv", "burstgpt", "Timestamp,Model,Request tokens,Response tokens\n"
                            "1,x,2.5,3\n", 2, "Request tokens must be a whole number"),
    "burstgpt missing time": ("b.csv", "burstgpt", "Timestamp,Model,Request tokens,Response tokens\n"
                              "1,x,2,3\n,x,2,3\n", 3, "missing Timestamp"),
    "mooncake bad json": ("m.jsonl", "mooncake", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
                          '{"timestamp": 1, \n', 2, "not valid JSON"),
    "mooncake missing key": ("m.jsonl", "mooncake", '{"timestamp": 0, "input_length": 1}\n', 1,
                             "missing 'output_length'"),
    "mooncake negative": ("m.jsonl", "mooncake", '{"timestamp": 0, "input_length": -1, "output_length": 1}\n',
                          1, "input_length is negative"),
    "mooncake fractional": ("m.jsonl", "mooncake", '{"timestamp": 0, "input_length": 1.5, "output_length": 1}\n',
                            1, "input_length must be a whole number"),
    "mooncake bad hashes": ("m.jsonl", "mooncake",
                            '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "1 2"}\n',
                            1, "hash_ids must be a list"),
    "mooncake empty": ("m.jsonl", "mooncake", "\n", 1, "empty"),
}


@pytest.mark.parametrize("case", BAD_PUBLIC_FILES)
def test_bad_public_file_raises_error_naming_file_and_line(tmp_path, case):
    name, fmt, text, line, problem = BAD_PUBLIC_FILES[case]
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as err:
        load_trace(path, fmt=fmt)
    assert str(path) in str(err.value) and f"line {line}:" in str(err.value)
    assert problem in str(err.value)


@pytest.fixture(scope="module")
def azure_conv():
    if AZURE_CONV_2023 is None:
        pytest.skip("LLMSIM_TRACES is unset: set it to a folder holding azure2023/AzureLLMInferenceTrace_conv.csv")
    if not AZURE_CONV_2023.is_file():
        pytest.skip(f"LLMSIM_TRACES has no {AZURE_CONV_2023.relative_to(TRACES)}")
    return load_trace(AZURE_CONV_2023)


def test_real_azure_conv_keeps_every_row_and_its_span(azure_conv):
    assert len(azure_conv) == 19_366
    assert azure_conv.span_s == pytest.approx(3504, abs=10)  # ~58.4 min
    assert azure_conv.notes == {"dropped_zero_output": 0, "dropped_zero_prompt": 0, "out_of_order": 0}


def test_real_azure_conv_token_and_rate_statistics(azure_conv):
    stats = summary(azure_conv)
    assert stats["prompt_p50"] == pytest.approx(1020, abs=5)
    assert stats["output_p50"] == pytest.approx(129, abs=2)
    assert stats["busiest_minute_rate"] == pytest.approx(8.45, abs=0.1)
    assert stats["mean_rate"] == pytest.approx(5.53, abs=0.01)
    rates = rate_per_window(azure_conv, 600.0)
    np.testing.assert_allclose(rates, [4.78, 5.20, 6.87, 6.78, 5.21, 3.44], atol=0.01)
