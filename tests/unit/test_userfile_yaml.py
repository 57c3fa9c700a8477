"""A YAML key given twice is an error naming it and both lines (PyYAML would keep the last silently)."""

import pytest
import yaml

from inferasim.catalog.userfile import load_yaml, load_yaml_all


def test_a_key_given_twice_is_refused_with_both_lines() -> None:
    text = "model: m\nhardware:\n  gpu: MI355X\n  maxGPUs: 8\n  maxGPUs: 64\n"
    with pytest.raises(yaml.YAMLError, match=r"key 'maxGPUs' is given twice \(lines 4 and 5\)"):
        load_yaml(text)
    with pytest.raises(yaml.YAMLError, match="key 'a' is given twice"):
        load_yaml_all("x: 1\n---\na: 1\na: 2\n")


def test_what_safe_load_reads_reads_the_same() -> None:
    text = "a: 1\nb: [1, 2]\nc:\n  - {k: 1}\n  - {k: 2}\nd: {x: 1, y: 2}\n"
    assert load_yaml(text) == yaml.safe_load(text)
    assert load_yaml_all("a: 1\n---\na: 2\n") == [{"a": 1}, {"a": 2}]
    # Safe: no arbitrary Python objects.
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']")


def test_tune_cli_refuses_a_spec_with_a_key_twice(tmp_path, capsys) -> None:
    from inferasim.cli.main import main

    spec = tmp_path / "spec.yaml"
    spec.write_text("model: meta-llama/Llama-3.1-70B\nhardware:\n  gpu: MI355X\n  maxGPUs: 8\n  maxGPUs: 64\n")
    assert main(["tune", str(spec)]) == 2
    assert "maxGPUs' is given twice" in capsys.readouterr().err
