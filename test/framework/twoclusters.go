package framework

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
)

// Cluster is a second, bare control plane (kube-apiserver and etcd with
// the same CRDs, no kvnet webhooks): the other cluster of a cross-cluster
// test.
type Cluster struct {
	Env    *envtest.Environment
	Config *rest.Config
	Client client.Client
}

// StartCluster boots another control plane with kvnet's namespace. Call
// Stop when done.
func StartCluster() (*Cluster, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	crds, err := CRDPaths()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true, Scheme: app.Scheme()}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the second control plane: %w", err)
	}
	c := &Cluster{Env: te, Config: cfg}
	if c.Client, err = client.New(cfg, client.Options{Scheme: app.Scheme()}); err != nil {
		_ = te.Stop()
		return nil, err
	}
	if err := c.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KvnetNamespace}}); err != nil {
		_ = te.Stop()
		return nil, err
	}
	return c, nil
}

// Stop ends the control plane.
func (c *Cluster) Stop() { _ = c.Env.Stop() }
