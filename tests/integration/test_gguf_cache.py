"""The GGUF → safetensors cache is written atomically: a failed save leaves nothing a later load trusts."""
import pytest

from steer_ui.model import loading

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a full GGUF conversion that fails at its end: about two minutes
def test_failed_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STEER_UI_CACHE", str(tmp_path))
    import transformers

    def die(self, *args, **kwargs):  # the model's weights are already written to the temp dir by now
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", die)
    gguf = loading.embedded_gguf_path()
    target = loading.gguf_cache_dir(gguf)
    assert str(target).startswith(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        loading._convert_gguf(gguf, target, lambda f, m: None)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no half-written temp directory left either


def test_partial_temp_directory_is_ignored(tmp_path, monkeypatch, gemma):
    """A stray .tmp-* directory next to the cache (a killed process) is never picked up."""
    import os

    gguf = loading.embedded_gguf_path()
    real = loading.gguf_cache_dir(gguf)  # complete: the gemma fixture loaded through it
    monkeypatch.setenv("STEER_UI_CACHE", str(tmp_path))
    target = loading.gguf_cache_dir(gguf)
    target.parent.mkdir(parents=True)
    stray = target.parent / ".tmp-crashed"
    stray.mkdir()
    (stray / "model.safetensors").write_bytes(b"half")
    os.symlink(real, target)
    handle = loading.load_model()
    assert handle.arch.num_layers == 18
    assert (stray / "model.safetensors").read_bytes() == b"half"  # untouched, unused
