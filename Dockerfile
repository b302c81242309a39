# The pgpilot operator image: manager, controller and agent binaries, the Helm chart the
# manager renders, and watches.yaml. One image serves the operator Deployment and the
# install-agent init container of every PostgreSQL pod.
#
# Works with the classic builder and BuildKit. GO_VERSION must satisfy the `go` line of
# go.mod: the golang images set GOTOOLCHAIN=local and will not fetch a newer toolchain.
ARG GO_VERSION=1.23

FROM golang:${GO_VERSION} AS builder
# Set by BuildKit for --platform builds; empty means the builder's own platform.
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src

# Dependencies first, so that this layer is reused while only the sources change.
COPY go.mod go.sum ./
RUN go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
# Every command under cmd/ (manager, controller, agent): static, no paths or symbols, and
# the operator's version (status.operatorVersion).
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X github.com/pgpilot/pgpilot/internal/version.Version=${VERSION}" -o /out/ ./cmd/...

# scratch has no /tmp; the manager's Helm client writes its cache there.
RUN mkdir -p /rootfs/tmp && chmod 1777 /rootfs/tmp

FROM scratch

ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="pgpilot" \
      org.opencontainers.image.description="Kubernetes operator for highly available PostgreSQL: Helm-based manager, failover controller and in-pod agent" \
      org.opencontainers.image.source="https://github.com/pgpilot/pgpilot" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

COPY --from=builder --chown=65532:65532 /rootfs/tmp /tmp
COPY --from=builder /out/ /usr/local/bin/
COPY watches.yaml /opt/pgpilot/watches.yaml
COPY helm-charts/ /opt/pgpilot/helm-charts/

# No /etc/passwd in scratch: Helm finds its home through $HOME.
ENV HOME=/tmp
WORKDIR /opt/pgpilot
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/manager"]
