#!/usr/bin/env bash
# What `make demo`, `make test` and `.ci/run` need, brought in once (docs/quickstart.md):
#
#   scripts/bootstrap.sh system demo|test   the system packages (Debian/Ubuntu, apt-get, as root)
#   scripts/bootstrap.sh venv PYTHON VENV   the virtualenv with the package and its test extra
#
# system: as root with apt-get, installs what is missing and says so; otherwise
#   - demo: goes on quietly (without sshd the demo runs its hosts on the embedded SSH server and
#     says so itself);
#   - test: stops with one line naming the packages to install.
# HETERO_GPU_NO_SYSTEM_INSTALL=1 never installs (behaves as if not root).
# Every failure is one line on stderr that says what to do; never a traceback.
set -uo pipefail

say() { printf '%s\n' "$*" >&2; }

# An executable file NAME in a PATH directory (what the tests' own look-ups accept).
on_path() {
  local dir
  local IFS=:
  for dir in $PATH; do [ -n "$dir" ] && [ -f "$dir/$1" ] && [ -x "$dir/$1" ] && return 0; done
  return 1
}
have_sshd() { [ -x /usr/sbin/sshd ] || [ -x /usr/local/sbin/sshd ] || on_path sshd; }
have_ssh_client() { on_path ssh-keygen && on_path ssh; }
have_initdb() {
  local f
  { [ -n "${HETERO_GPU_PG_BIN:-}" ] && [ -x "$HETERO_GPU_PG_BIN/initdb" ]; } || on_path initdb && return 0
  for f in /usr/lib/postgresql/*/bin/initdb; do [ -x "$f" ] && return 0; done
  return 1
}
have_redis() { [ -x /usr/bin/redis-server ] || on_path redis-server; }
have_chromium() { [ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ] || on_path chromium; }

# The Debian packages `purpose` needs that are not installed.
missing_packages() {
  local purpose=$1 pkgs=()
  have_sshd || pkgs+=(openssh-server)
  have_ssh_client || pkgs+=(openssh-client)
  if [ "$purpose" = test ]; then
    have_initdb || pkgs+=(postgresql)
    have_redis || pkgs+=(redis-server)
    have_chromium || pkgs+=(chromium)
  fi
  [ ${#pkgs[@]} -eq 0 ] || printf '%s\n' "${pkgs[@]}"
}

can_install() {
  [ "${HETERO_GPU_NO_SYSTEM_INSTALL:-0}" != 1 ] && [ "$(id -u)" = 0 ] && on_path apt-get
}

apt_install() {
  local log
  log=$(mktemp "${TMPDIR:-/tmp}/hetero-gpu-apt-XXXXXX.log")
  say "installing system packages: $* (apt-get; log: $log)"
  if DEBIAN_FRONTEND=noninteractive apt-get update -q >"$log" 2>&1 \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  say "apt-get could not install $* ($(grep -m1 -E '^(E|Err):' "$log" || tail -n1 "$log")); full log: $log"
  return 1
}

system() {
  local purpose=${1:-}
  case "$purpose" in demo|test) ;; *) say "usage: $0 system demo|test"; return 2 ;; esac
  local pkgs
  mapfile -t pkgs < <(missing_packages "$purpose")
  [ ${#pkgs[@]} -eq 0 ] && return 0
  if can_install && apt_install "${pkgs[@]}"; then
    return 0
  fi
  if [ "$purpose" = demo ]; then
    return 0  # the demo falls back to the embedded SSH server and says so
  fi
  local why="not root"
  [ "${HETERO_GPU_NO_SYSTEM_INSTALL:-0}" = 1 ] && why="HETERO_GPU_NO_SYSTEM_INSTALL=1"
  [ "$(id -u)" = 0 ] && ! on_path apt-get && why="no apt-get"
  can_install && why="apt-get failed"
  say "make test needs these system packages ($why, so not installed here): ${pkgs[*]} -- as root: apt-get install -y ${pkgs[*]}"
  return 1
}

# The line of pip's log that says what went wrong: its last ERROR line (not the bare "ERROR:
# Exception:" before a traceback), else the log's last line (a traceback's message).
pip_reason() {
  local line
  line=$(grep -E '^[[:space:]]*ERROR: ' "$1" | grep -v -E 'ERROR: Exception:[[:space:]]*$' | tail -n1)
  [ -n "$line" ] || line=$(grep -v -E '^[[:space:]]*$' "$1" | tail -n1)
  printf '%s' "$line" | sed -E 's/^[[:space:]]+//' | cut -c1-300
}

venv() {
  local python=${1:-python3} dir=${2:-.venv} log
  if ! { [ -x "$python" ] || on_path "$python"; }; then
    say "no $python: install Python 3.10 or newer (or give PYTHON=/path/to/python3)"
    return 1
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    say "$python is Python $("$python" -c 'import platform; print(platform.python_version())'): 3.10 or newer is needed (give PYTHON=...)"
    return 1
  fi
  if [ ! -x "$dir/bin/python" ]; then
    if ! "$python" -m venv "$dir" >/dev/null 2>&1; then
      rm -rf "$dir"
      if can_install && apt_install python3-venv && "$python" -m venv "$dir" >/dev/null 2>&1; then
        :
      else
        rm -rf "$dir"
        say "$python -m venv $dir failed: install the venv module (Debian/Ubuntu: apt-get install -y python3-venv)"
        return 1
      fi
    fi
  fi
  log="$dir/pip-install.log"
  echo "installing the package and its test extra into $dir (pip; log: $log)" >&2
  if ! { "$dir/bin/python" -m pip install -q --upgrade pip && "$dir/bin/python" -m pip install -q -e '.[test]'; } >"$log" 2>&1; then
    say "pip could not install the Python packages ($(pip_reason "$log")); full log: $log"
    return 1
  fi
  touch "$dir/.installed"
}

case "${1:-}" in
  system) shift; system "$@" ;;
  venv) shift; venv "$@" ;;
  *) say "usage: $0 system demo|test | venv PYTHON VENV"; exit 2 ;;
esac
