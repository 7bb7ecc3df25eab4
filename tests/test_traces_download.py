"""The downloader: clear failure offline, atomic success, and local copies found first."""
from __future__ import annotations

import io
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from traces import download as dl
from traces.io import load_trace


REAL_TRACES = os.environ.get(dl.TRACES_ENV)  # read before the fixture below unsets it


class FakeResponse(io.BytesIO):
    headers: dict = {}


@pytest.fixture(autouse=True)
def no_local_traces(tmp_path, monkeypatch):
    """Nothing outside tmp_path is looked in: no $LLMSIM_TRACES, the cache under tmp_path."""
    monkeypatch.delenv(dl.TRACES_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_offline_download_fails_naming_the_url_and_where_to_put_the_file(tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(dl.DownloadError) as err:
        dl.download("burstgpt", tmp_path, use_local=False)
    message = str(err.value)
    assert dl.PUBLIC_TRACES["burstgpt"].url in message
    assert "name resolution" in message and "place the file at" in message
    assert str(tmp_path / "burstgpt" / "BurstGPT_1.csv") in message
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing half-written is left behind


def test_download_writes_the_file_under_its_subfolder(tmp_path, monkeypatch):
    body = b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,GPT-4,10,0,10,API log\n" \
           b"7,GPT-4,10,3,13,API log\n"
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: FakeResponse(body))
    path = dl.download("burstgpt", tmp_path, use_local=False)
    assert path == tmp_path / "burstgpt" / "BurstGPT_1.csv"
    assert load_trace(path).notes["dropped_failed"] == 1


def test_download_refuses_a_git_lfs_pointer_or_error_page(tmp_path, monkeypatch):
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:4bb3\nsize 52283111\n"
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: FakeResponse(pointer))
    with pytest.raises(dl.DownloadError, match="did not return a burstgpt trace"):
        dl.download("burstgpt", tmp_path, use_local=False)
    assert not list(tmp_path.rglob("*.csv*"))


def test_a_local_copy_is_used_without_touching_the_network(tmp_path, monkeypatch):
    def no_network(url, timeout=None):
        raise AssertionError("should not download")
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    (tmp_path / "conversation_trace.jsonl").write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n')
    assert dl.find_local("mooncake-conversation", (tmp_path,)) == tmp_path / "conversation_trace.jsonl"
    assert dl.download("mooncake-conversation", tmp_path) == tmp_path / "conversation_trace.jsonl"


def test_the_azure_trace_is_found_under_llmsim_traces(monkeypatch):
    real = REAL_TRACES
    if not real:
        pytest.skip(f"{dl.TRACES_ENV} is unset: set it to a folder holding azure2023/AzureLLMInferenceTrace_conv.csv")
    monkeypatch.setenv(dl.TRACES_ENV, real)
    expected = Path(real) / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    assert dl.find_local("azure-conv-2023") == expected


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="azure-conv-2023"):
        dl.download("azure-conv-1999")
