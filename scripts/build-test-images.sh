#!/usr/bin/env bash
# Build the images the container tests use, with no registry: a busybox image from Debian's
# busybox-static, and a Python image from the host's /usr/bin/python3 and the libraries it
# loads. Each is made with `docker import` of a rootfs; one that exists is kept.
set -euo pipefail

BUSYBOX_IMAGE=${BUSYBOX_IMAGE:-noduslocal-test/busybox:1}
PYTHON_IMAGE=${PYTHON_IMAGE:-noduslocal-test/python:3.11}

have() { docker image inspect "$1" >/dev/null 2>&1; }

busybox_rootfs() {  # $1 = rootfs directory
    local root=$1
    mkdir -p "$root"/{bin,etc,tmp,workspace,proc,sys,dev}
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
}

import_rootfs() {  # $1 = rootfs, $2 = image, $3... = --change arguments
    local root=$1 image=$2
    shift 2
    tar -C "$root" -c . | docker import "$@" - "$image" >/dev/null
}

if [ ! -x /bin/busybox ] || ! /bin/busybox --list >/dev/null 2>&1; then
    echo "busybox-static is not installed (apt-get install busybox-static)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! have "$BUSYBOX_IMAGE"; then
    busybox_rootfs "$work/busybox"
    import_rootfs "$work/busybox" "$BUSYBOX_IMAGE" \
        --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]'
    echo "built $BUSYBOX_IMAGE"
fi

if ! have "$PYTHON_IMAGE"; then
    py=/usr/bin/python3.11
    root="$work/python"
    busybox_rootfs "$root"
    mkdir -p "$root/usr/bin" "$root/usr/lib"
    cp "$py" "$root/usr/bin/python3.11"
    ln -s python3.11 "$root/usr/bin/python3"
    ln -s python3 "$root/usr/bin/python"
    tar -C / -c --exclude='__pycache__' --exclude='test' --exclude='idlelib' \
        --exclude='tkinter' usr/lib/python3.11 | tar -C "$root" -x
    # The interpreter's and its extension modules' shared libraries, with their links.
    for lib in $( (ldd "$py"; find /usr/lib/python3.11/lib-dynload -name '*.so' -exec ldd {} \;) \
                 | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u); do
        cp -L --parents "$lib" "$root"
        real=$(readlink -f "$lib")
        [ "$real" = "$lib" ] || cp --parents "$real" "$root"
    done
    import_rootfs "$root" "$PYTHON_IMAGE" \
        --change 'ENV PATH=/usr/bin:/bin' --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/usr/bin/python3"]'
    echo "built $PYTHON_IMAGE"
fi
