# Sourced by scripts/test: installs the pinned coding-agent CLIs that tests/test_agents_clients.py drives
# against `localspec serve`, once, under the user cache dir (like the stock llama.cpp build), and exports
# LOCALSPEC_AGENTS_DIR (its bin/ holds claude, codex and opencode). Without npm the tests skip.

AGENT_PACKAGES="@anthropic-ai/claude-code@2.1.332 @openai/codex@0.169.0 opencode-ai@1.18.33"

install_agents() {
    command -v npm >/dev/null || { echo "scripts/lib/agents.sh: npm not found; the agent client tests will skip" >&2; return 0; }
    local key dir
    key=$(printf '%s' "$AGENT_PACKAGES" | sha256sum | cut -c1-16)
    dir="${XDG_CACHE_HOME:-$HOME/.cache}/localspec/agents/$key"
    if [ ! -f "$dir/.installed" ]; then
        echo "Installing the pinned agent clients (once): $AGENT_PACKAGES" >&2
        rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
        # shellcheck disable=SC2086
        if ! npm install --prefix "$dir.tmp" --no-audit --no-fund --loglevel=error $AGENT_PACKAGES >&2; then
            echo "scripts/lib/agents.sh: npm install failed; the agent client tests will skip" >&2
            rm -rf "$dir.tmp"
            return 0
        fi
        rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.installed"
    fi
    export LOCALSPEC_AGENTS_DIR="$dir/node_modules/.bin"
}
