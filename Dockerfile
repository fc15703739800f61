# tdist on a fresh Debian 12, as the README's two commands set it up and test it.
#   docker build -t tdist .                         # README command 1: setup + quickstart
#   docker run --rm --privileged tdist              # README command 2: the whole suite
# --privileged: the suite's network-namespace and single-node SLURM tests need the
# capabilities a plain container lacks (ip netns, unshare, slurmd); without it they fail.
# The image needs Debian's archive and PyPI, nothing else.
FROM debian:12
ENV DEBIAN_FRONTEND=noninteractive
# setup.sh installs every other package itself; it needs only a shell, apt and certificates.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /tdist
COPY . .
RUN tools/setup.sh && tools/quickstart.sh
CMD ["tools/test.sh"]
