package main

import (
	"archive/tar"
	"bytes"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// rootfs is the image's base: /etc/passwd and /etc/group naming the nonroot
// user (so tools that map the UID show a name), nsswitch.conf so Go's
// resolver reads /etc/hosts first. The Dockerfile COPYs the same directory.
//
//go:embed rootfs
var rootfs embed.FS

// The image's fixed facts, shared with the Dockerfile (keep them equal).
const (
	// BinaryPath is where the kvnet binary lives and the entrypoint.
	BinaryPath = "/kvnet"
	// User is distroless' nonroot UID:GID: not root, and numeric so the
	// kubelet's runAsNonRoot check can verify it without /etc/passwd.
	User = "65532:65532"
	// License is the SPDX identifier of kvnet's license (LICENSE).
	License = "Apache-2.0"
)

// Spec is one image build: the binaries per platform and the labels.
type Spec struct {
	// Binaries maps a platform ("linux/amd64", "linux/arm/v7") to the
	// static kvnet binary built for it.
	Binaries map[string]string
	// Ref is the image's name and tag ("ghcr.io/kvnet/kvnet:0.1.0"); the tag
	// names the index in the layout (oci:<dir>:<tag> for skopeo).
	Ref string
	// Version and Commit become OCI labels.
	Version, Commit string
	// Created is the image's creation time and every file's mtime: the
	// commit's time, so the same commit always gives the same digest.
	Created time.Time
}

// Build writes the multi-platform image as an OCI image layout at dir
// (replacing what is there) and returns the index's digest.
func Build(dir string, s Spec) (v1.Hash, error) {
	if len(s.Binaries) == 0 {
		return v1.Hash{}, fmt.Errorf("no --binary given")
	}
	_, tag, ok := cutTag(s.Ref)
	if !ok {
		return v1.Hash{}, fmt.Errorf("--ref %q: want <repository>:<tag>", s.Ref)
	}
	base, err := baseLayer(s.Created)
	if err != nil {
		return v1.Hash{}, err
	}
	platforms := make([]string, 0, len(s.Binaries))
	for p := range s.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms) // a stable index order: a stable digest
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("--binary %s: %w", p, err)
		}
		img, err := platformImage(base, s.Binaries[p], *plat, s)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("image for %s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: plat},
		})
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	// ref.name carries the tag only, as the OCI layout spec and skopeo's
	// oci:<dir>:<tag> expect.
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          s.Ref,
	})); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

func platformImage(base v1.Layer, binary string, plat v1.Platform, s Spec) (v1.Image, error) {
	bin, err := binaryLayer(binary, s.Created)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, base, bin)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant, cf.OSVersion = plat.OS, plat.Architecture, plat.Variant, plat.OSVersion
	cf.Created = v1.Time{Time: s.Created}
	cf.Config = v1.Config{
		Entrypoint: []string{BinaryPath},
		User:       User,
		WorkingDir: "/",
		// What Docker gives every image, so the Dockerfile's matches.
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "kvnet",
			"org.opencontainers.image.version":  s.Version,
			"org.opencontainers.image.revision": s.Commit,
			"org.opencontainers.image.source":   "https://github.com/kvnet/kvnet",
			"org.opencontainers.image.licenses": License,
		},
	}
	return mutate.ConfigFile(img, cf)
}

// baseLayer is rootfs/ as a tar layer, root-owned, with fixed mtimes.
func baseLayer(mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := fs.WalkDir(rootfs, "rootfs", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "rootfs" {
			return err
		}
		name := strings.TrimPrefix(p, "rootfs/")
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
		}
		data, err := rootfs.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layerOf(buf.Bytes())
}

// binaryLayer is the kvnet binary at BinaryPath, root-owned and 0755: the
// nonroot user can run it but not replace it.
func binaryLayer(binary string, mtime time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: path.Base(BinaryPath), Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layerOf(buf.Bytes())
}

func layerOf(tarData []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarData)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// cutTag splits "registry:5000/kvnet/kvnet:0.1.0" at the tag's colon (the
// last one after the last slash).
func cutTag(ref string) (repo, tag string, ok bool) {
	i := strings.LastIndex(ref, ":")
	if i <= 0 || i < strings.LastIndex(ref, "/") || i == len(ref)-1 {
		return "", "", false
	}
	return ref[:i], ref[i+1:], true
}
