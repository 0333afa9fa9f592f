#!/usr/bin/env bash
# Install noduslocal on a shared workstation, once, for every user of it (as root): a venv in
# /opt/noduslocal, the systemd units, the groups, a commented default config and the CLI on
# PATH. Run it again to upgrade: it keeps your config and your data. `--user` installs it
# for yourself without root. The README's quickstart stays the way to try it; this is the
# admin's way to keep it.
#
#   scripts/install.sh [--user] [--prefix DIR] [--no-start]
#   scripts/install.sh --uninstall [--purge]     (--purge: the data, config and groups too)
#   scripts/install.sh --root DIR ...            (everything below DIR, nothing started: tests)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

MODE=system UNINSTALL= PURGE= START=1 ROOT= PREFIX=
while [ $# -gt 0 ]; do
    case "$1" in
        --user) MODE=user ;;
        --prefix) PREFIX=$2; shift ;;
        --prefix=*) PREFIX=${1#*=} ;;
        --root) ROOT=$2; shift ;;
        --root=*) ROOT=${1#*=} ;;
        --no-start) START= ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$PURGE" ] && [ -z "$UNINSTALL" ] && { echo "install.sh: --purge goes with --uninstall" >&2; exit 2; }
if [ "$MODE" = system ] && [ "$(id -u)" != 0 ] && [ -z "$ROOT" ]; then
    echo "install.sh: the shared install needs root (sudo $0), or use --user for yourself" >&2
    exit 2
fi
ROOT=${ROOT%/}
[ -n "$ROOT" ] && ROOT=$(mkdir -p "$ROOT" && cd "$ROOT" && pwd)

log() { printf '\033[1m== %s\033[0m\n' "$*"; }

if [ "$MODE" = system ]; then
    PREFIX=${PREFIX:-/opt/noduslocal}
    UNITS=/etc/systemd/system
    CONFIG_DIR=/etc/noduslocal
    DATA_DIR=/var/lib/noduslocal
    BIN_LINK=/usr/local/bin/noduslocal
    SYSTEMCTL=(systemctl)
    UNIT_SRC=$REPO/systemd
else
    PREFIX=${PREFIX:-$HOME/.local/opt/noduslocal}
    UNITS=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user
    CONFIG_DIR=${XDG_CONFIG_HOME:-$HOME/.config}/noduslocal
    DATA_DIR=${XDG_DATA_HOME:-$HOME/.local/share}/noduslocal
    BIN_LINK=$HOME/.local/bin/noduslocal
    SYSTEMCTL=(systemctl --user)
    UNIT_SRC=$REPO/systemd/user
fi

# systemd is asked only on a real install where it runs the machine (not in a container or
# a staged --root); elsewhere the script says how to start the daemon by hand.
have_systemd() {
    [ -z "$ROOT" ] || return 1
    if [ "$MODE" = system ]; then [ -d /run/systemd/system ]; else "${SYSTEMCTL[@]}" show-environment >/dev/null 2>&1; fi
}

remove_link() {  # the CLI link, only when it is ours
    local link=$ROOT$BIN_LINK
    if [ -L "$link" ] && [ "$(readlink "$link")" = "$PREFIX/bin/noduslocal" ]; then
        rm -f "$link"
    fi
}

if [ -n "$UNINSTALL" ]; then
    if have_systemd; then
        log "stopping the daemon (its jobs are stopped by the next start, or not at all)"
        "${SYSTEMCTL[@]}" disable --now noduslocal.socket noduslocal.service 2>/dev/null || true
    fi
    log "removing $PREFIX, the units and the CLI link"
    rm -f "$ROOT$UNITS/noduslocal.service" "$ROOT$UNITS/noduslocal.socket"
    if [ "$MODE" = system ]; then
        rm -f "$ROOT/etc/sysusers.d/noduslocal.conf" "$ROOT/etc/tmpfiles.d/noduslocal.conf"
    fi
    remove_link
    rm -rf "${ROOT}${PREFIX:?}"
    have_systemd && "${SYSTEMCTL[@]}" daemon-reload
    if [ -n "$PURGE" ]; then
        log "purging $DATA_DIR (every job, log and output) and $CONFIG_DIR"
        rm -rf "${ROOT}${DATA_DIR:?}" "${ROOT}${CONFIG_DIR:?}"
        if [ "$MODE" = system ]; then
            for group in noduslocal-admin noduslocal; do
                if [ -n "$ROOT" ]; then
                    [ -f "$ROOT/etc/group" ] && sed -i "/^$group:/d" "$ROOT/etc/group" \
                        "$ROOT/etc/gshadow" 2>/dev/null || true
                elif getent group "$group" >/dev/null; then
                    groupdel "$group"
                fi
            done
        fi
    else
        echo "kept: $DATA_DIR (jobs, logs, the database) and $CONFIG_DIR; --purge removes them"
    fi
    exit 0
fi

usable() { "$1" -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 11)' 2>/dev/null; }
# The interpreter itself, not a wrapper on root's PATH (pyenv's shims): the venv links to it.
real_python() { "$1" -c 'import os, sys; print(os.path.realpath(sys.executable))' 2>/dev/null; }
# The shared install's venv runs as every user (the CLI, the SDK): its interpreter must be one
# they can execute, not one in root's home. Checked as nobody, who has no rights of its own.
everyone_runs() {
    [ "$MODE" != system ] && return 0
    [ "$(id -u)" = 0 ] && command -v runuser >/dev/null || return 0
    runuser -u nobody -- "$1" -c 'import venv' >/dev/null 2>&1
}
GIVEN=${PYTHON:-}
PYTHON=${PYTHON:-python3}
if ! usable "$PYTHON"; then
    if [ -z "$GIVEN" ] && usable /usr/bin/python3; then
        PYTHON=/usr/bin/python3
    elif [ "$(id -u)" = 0 ] && [ -z "$ROOT" ] && command -v apt-get >/dev/null; then
        log "installing python3 and python3-venv"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
        PYTHON=/usr/bin/python3
    else
        echo "install.sh: needs Python 3.11 or newer with venv ($PYTHON has none)" >&2
        exit 1
    fi
fi
PYTHON=$(real_python "$PYTHON")
if ! everyone_runs "$PYTHON"; then
    if [ -z "$GIVEN" ] && usable /usr/bin/python3 && everyone_runs /usr/bin/python3; then
        log "$PYTHON is private to $(id -un) (other users cannot run it): using /usr/bin/python3"
        PYTHON=/usr/bin/python3
    else
        echo "install.sh: other users cannot run $PYTHON, so they could not run noduslocal" \
             "from a venv built on it; give an interpreter everyone can run, e.g." \
             "PYTHON=/usr/bin/python3 $0" >&2
        exit 1
    fi
fi

VENV=$ROOT$PREFIX
if [ ! -x "$VENV/bin/python" ]; then
    log "creating the venv $PREFIX"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
log "installing noduslocal into $PREFIX"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$REPO" \
    >"$VENV/pip.log" 2>&1 || { cat "$VENV/pip.log"; exit 1; }
# Wheels of noduslocal and everything it needs, readable by all: a user installs the client
# (CLI and SDK) into their own venv or conda env offline, `pip install --no-index
# --find-links PREFIX/wheels noduslocal`.
log "wheels for users' own environments in $PREFIX/wheels"
rm -rf "$VENV/wheels"
"$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --wheel-dir "$VENV/wheels" \
    "$REPO" >>"$VENV/pip.log" 2>&1 || { cat "$VENV/pip.log"; exit 1; }
chmod -R a+rX "$VENV/wheels"
# The host jobs' compiled supervisor, built now rather than at the daemon's first start.
"$VENV/bin/python" -m noduslocal.daemon.runtime.compiled_shim >/dev/null 2>&1 || true

log "the units in $UNITS"
mkdir -p "$ROOT$UNITS"
for unit in noduslocal.service noduslocal.socket; do
    sed "s#/opt/noduslocal/bin/noduslocald#$PREFIX/bin/noduslocald#g;
         s#file:///opt/noduslocal/#file://$PREFIX/#g" "$UNIT_SRC/$unit" >"$ROOT$UNITS/$unit"
    chmod 644 "$ROOT$UNITS/$unit"
done

if [ "$MODE" = system ]; then
    log "the groups noduslocal (users) and noduslocal-admin (admins)"
    mkdir -p "$ROOT/etc/sysusers.d" "$ROOT/etc/tmpfiles.d"
    install -m 644 "$REPO/systemd/noduslocal.sysusers" "$ROOT/etc/sysusers.d/noduslocal.conf"
    install -m 644 "$REPO/systemd/noduslocal.tmpfiles" "$ROOT/etc/tmpfiles.d/noduslocal.conf"
    if command -v systemd-sysusers >/dev/null; then
        systemd-sysusers ${ROOT:+--root="$ROOT"} "$ROOT/etc/sysusers.d/noduslocal.conf"
    elif [ -z "$ROOT" ]; then
        groupadd -f -r noduslocal
        groupadd -f -r noduslocal-admin
    fi
    if command -v systemd-tmpfiles >/dev/null; then
        systemd-tmpfiles ${ROOT:+--root="$ROOT"} --create "$ROOT/etc/tmpfiles.d/noduslocal.conf"
    else
        install -d -m 711 "$ROOT$DATA_DIR"
    fi
fi

CONFIG=$ROOT$CONFIG_DIR/config.toml
mkdir -p "$ROOT$CONFIG_DIR"
if [ -e "$CONFIG" ]; then
    log "kept your config $CONFIG_DIR/config.toml (the shipped one: config.toml.default)"
else
    log "a commented default config in $CONFIG_DIR/config.toml"
    install -m 644 "$REPO/noduslocal/default_config.toml" "$CONFIG"
fi
install -m 644 "$REPO/noduslocal/default_config.toml" "$ROOT$CONFIG_DIR/config.toml.default"

mkdir -p "$VENV/share/doc"
cp "$REPO"/docs/*.md "$VENV/share/doc/"

LINK=$ROOT$BIN_LINK
mkdir -p "$(dirname "$LINK")"
if [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
    echo "note: $BIN_LINK is another program; run $PREFIX/bin/noduslocal, or put $PREFIX/bin on PATH"
else
    ln -sfn "$PREFIX/bin/noduslocal" "$LINK"
fi

if [ -z "$START" ] || [ -n "$ROOT" ]; then
    log "installed (not started)"
elif have_systemd; then
    log "starting: the socket now, the daemon on its first call"
    "${SYSTEMCTL[@]}" daemon-reload
    "${SYSTEMCTL[@]}" enable --now noduslocal.socket
    # An upgrade: the running daemon gives way to the new one; its jobs run on and are adopted.
    "${SYSTEMCTL[@]}" try-restart noduslocal.service
else
    log "installed; systemd does not run this machine, so start the daemon yourself:"
    echo "    $PREFIX/bin/noduslocald --config $CONFIG_DIR/config.toml &"
fi
if [ "$MODE" = system ]; then
    echo "Users need the group: usermod -aG noduslocal NAME (admins: noduslocal-admin)."
fi
echo "Check it with: noduslocal doctor"
