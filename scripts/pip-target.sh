# Sourced by test.sh and cuda-tools.sh: `pip_target DIR ARGS...` installs Python packages
# into DIR (`pip install --target`: no virtual environment needed), with
# --break-system-packages where the system's pip refuses without one.
pip_target() {
    local dir=$1
    shift
    python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --target "$dir" "$@" ||
        python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --break-system-packages \
            --target "$dir" "$@"
}
