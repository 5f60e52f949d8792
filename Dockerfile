# dgxmm in a container. It manages engine containers through the Docker socket it is given and
# reaches them on the network it shares with them (see docs/docker.md and compose.yaml).
FROM python:3.11-slim

WORKDIR /opt/dgxmm
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/dgxmm dgxmm

# Engine state lives in the data directory; mount a volume there.
VOLUME /var/lib/dgxmm
EXPOSE 8090
ENTRYPOINT ["dgxmm"]
CMD ["serve", "--config", "/etc/dgxmm/dgxmm.toml"]
