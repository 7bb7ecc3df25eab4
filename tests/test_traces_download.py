"""The downloader: clear failure offline, atomic success, and local copies found first."""
from __future__ import annotations

import io
import urllib.error
import urllib.request

import pytest

from traces import download as dl
from traces.io import load_trace


class FakeResponse(io.BytesIO):
    headers: dict = {}


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
    assert not list(tmp_path.rglob("*.part"))  # nothing half-written is left behind


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


def test_shared_azure_trace_is_found_when_present():
    expected = dl.SHARED_TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    if not expected.is_file():
        pytest.skip(f"no shared traces at {dl.SHARED_TRACES}")
    assert dl.find_local("azure-conv-2023") == expected


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="azure-conv-2023"):
        dl.download("azure-conv-1999")
