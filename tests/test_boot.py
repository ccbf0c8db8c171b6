"""The Python API on its own: opening the image is enough to call every method in it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from batos.shell.runtime import open_image
from prototypes import kernel

SHOUT = "def shout(self, text):\n    return text.upper() + '!'\n"

#: All a user's script imports: the documented entry point, nothing that loads the kernel.
USER_SCRIPT = textwrap.dedent(
    """
    import sys
    from batos.shell.runtime import open_image

    with open_image(sys.argv[1]) as image:
        print(image.transact(lambda root: root["objects"]["brick"].shout("hello")))
    """
)


def test_a_fresh_interpreter_calls_a_sandboxed_method_another_process_installed(
    file_uri: str,
) -> None:
    with open_image(file_uri, create=True) as image:
        image.transact(lambda root: kernel.add_method(root["objects"]["brick"], "shout", SHOUT))
        with image.read() as root:
            assert root["objects"]["brick"]._slots()["shout"].compiler == "sandbox"
    done = subprocess.run(
        [sys.executable, "-c", USER_SCRIPT, file_uri],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "HELLO!"


def test_open_image_refuses_a_missing_image_unless_asked_to_create_it(tmp_path) -> None:
    from batos.errors import ImageNotFoundError

    path = tmp_path / "image" / "live_image.fs"
    uri = f"file://{path}"
    with pytest.raises(ImageNotFoundError) as refused:
        open_image(uri)
    assert f"batos --image {uri} init" in refused.value.hint
    assert "create=True" in refused.value.hint
    assert not path.parent.exists() or not any(path.parent.iterdir())  # nothing left behind
    with open_image(uri, create=True) as image, image.read() as root:
        assert "brick" in root["objects"]
    with open_image(uri) as image:  # it exists now
        assert image.uri == uri


def test_open_image_follows_the_command_line_where_it_allows_creating(tmp_path) -> None:
    from batos.errors import ImageNotFoundError
    from store.core.image import creating

    uri = f"file://{tmp_path / 'live_image.fs'}"
    with creating(False), pytest.raises(ImageNotFoundError) as refused:
        open_image(uri)
    assert "create=True" not in refused.value.hint  # the command line's own hint
    with creating(True):
        open_image(uri).close()
    assert (tmp_path / "live_image.fs").exists()
