"""Which Orchard image stands in for a Harbor task, and what of a Dockerfile is honoured.

Pure functions (no Harbor import), so they run on the suite's own Python.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.integrations.harbor.images import (
    ImageStandIn,
    UnsupportedEnvironmentError,
    orchard_image,
    parse_dockerfile,
    stand_in,
)


def test_a_dockerfile_without_build_steps_is_read() -> None:
    text = (
        "# syntax comment\nFROM debian:bookworm AS base\nLABEL a=b\nWORKDIR /srv\n"
        'WORKDIR app\nENV A=1 B="two words"\nENV LEGACY some value\nEXPOSE 8080\nUSER nobody\n'
    )
    assert parse_dockerfile(text) == ImageStandIn(
        "debian:bookworm",
        "/srv/app",
        {"A": "1", "B": "two words", "LEGACY": "some value"},
        "nobody",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM debian:bookworm\nRUN apt-get update \\\n  && apt-get install -y curl\n", ":2: RUN"),
        ("FROM debian:bookworm\nCOPY . /app\n", ":2: COPY"),
        ("FROM a AS one\nFROM b\n", ":2: multi-stage"),
        ("FROM --platform=linux/amd64 debian\n", "unsupported FROM"),
        ("ARG BASE=debian\nFROM $BASE\n", ":1: ARG before FROM"),
        ("FROM debian\nENV PATH=/opt/bin:$PATH\n", "uses a variable"),
        ("WORKDIR /x\n", "WORKDIR before FROM"),
        ("# nothing\n", "no FROM"),
        ("FROM debian \\\n", "continuation"),
    ],
)
def test_what_needs_a_build_is_refused_by_line(text: str, message: str) -> None:
    with pytest.raises(UnsupportedEnvironmentError, match=message):
        parse_dockerfile(text, "Dockerfile")


def test_the_prebuilt_image_wins_over_the_dockerfile_and_compose_is_refused(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\nRUN make\n")
    assert stand_in(tmp_path, "python:3.12") == ImageStandIn("python:3.12")
    with pytest.raises(UnsupportedEnvironmentError, match="RUN"):
        stand_in(tmp_path, None)
    (tmp_path / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(UnsupportedEnvironmentError, match="Compose"):
        stand_in(tmp_path, "python:3.12")


def test_an_empty_environment_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedEnvironmentError, match="neither docker_image nor a Dockerfile"):
        stand_in(tmp_path, None)


def test_the_mapping_then_the_fallback_then_the_name_itself() -> None:
    images = {"ubuntu:24.04": "debian:bookworm", "*": "py:small"}
    assert orchard_image("ubuntu:24.04", images) == "debian:bookworm"
    assert orchard_image("python:3.12", images) == "py:small"
    assert orchard_image("debian:bookworm", {}) == "debian:bookworm"
