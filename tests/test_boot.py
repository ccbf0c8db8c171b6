"""The Python API on its own: opening the image is enough to call every method in it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from graph.boot import open_image
from prototypes import kernel

SHOUT = "def shout(self, text):\n    return text.upper() + '!'\n"

#: All a user's script imports: the documented entry point, nothing that loads the kernel.
USER_SCRIPT = textwrap.dedent(
    """
    import sys
    from graph.boot import open_image

    with open_image(sys.argv[1]) as image:
        print(image.transact(lambda root: root["objects"]["brick"].shout("hello")))
    """
)


def test_a_fresh_interpreter_calls_a_sandboxed_method_another_process_installed(
    file_uri: str,
) -> None:
    with open_image(file_uri) as image:
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
