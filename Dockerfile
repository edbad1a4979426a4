# kvnet's image for those who build with Docker (buildx for several
# platforms: docker buildx build --platform linux/amd64,linux/arm64 .).
# `make image` builds the same image without a Docker engine (hack/image):
# the same static binary at /kvnet, the same hack/image/rootfs, the same
# nonroot user, entrypoint and labels. Keep the two equal.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS TARGETARCH TARGETVARIANT
ARG VERSION=dev
ARG COMMIT=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH GOARM=${TARGETVARIANT#v} \
    go build -trimpath -ldflags "-s -w -X github.com/kvnet/kvnet/internal/version.Version=$VERSION -X github.com/kvnet/kvnet/internal/version.Commit=$COMMIT" \
    -o /out/kvnet ./cmd/kvnet

# No shell, no package manager: the binary and the user database only.
FROM scratch
ARG VERSION=dev
ARG COMMIT=unknown
COPY hack/image/rootfs/ /
COPY --from=build --chmod=0755 /out/kvnet /kvnet
LABEL org.opencontainers.image.title=kvnet \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$COMMIT \
      org.opencontainers.image.source=https://github.com/kvnet/kvnet \
      org.opencontainers.image.licenses=Apache-2.0
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/kvnet"]
