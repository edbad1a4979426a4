package migration

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// CheckCluster validates the migration config against the cluster, which
// config.Validate cannot see: the NADs exist; the cross-cluster list has an
// address for every holder replica (a warning when none is spare for a
// rolling update's surge); the in-cluster pool covers the nodes (a warning
// otherwise: the virt-handlers of the extra nodes would be denied).
func CheckCluster(ctx context.Context, r client.Reader, m *config.Migration) (field.ErrorList, []string, error) {
	var errs field.ErrorList
	var warnings []string
	p := field.NewPath("migration")
	nadExists := func(ref netattach.Ref, fp *field.Path) error {
		var nad nadv1.NetworkAttachmentDefinition
		err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &nad)
		if apierrors.IsNotFound(err) {
			errs = append(errs, field.NotFound(fp, ref.String()))
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading NetworkAttachmentDefinition %s: %w", ref, err)
		}
		return nil
	}
	if ic := m.InCluster; ic != nil {
		if err := nadExists(ic.NAD, p.Child("inCluster", "nad")); err != nil {
			return nil, nil, err
		}
		n := inClusterNetwork(m)
		var nodes metav1.PartialObjectMetadataList
		nodes.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
		if err := r.List(ctx, &nodes); err != nil {
			return nil, nil, fmt.Errorf("listing nodes: %w", err)
		}
		need := int64(len(nodes.Items))
		if m.CrossCluster != nil && m.CrossCluster.AlsoInCluster {
			holders, err := holderReplicas(ctx, r, m.CrossCluster)
			if err != nil {
				return nil, nil, err
			}
			need += holders
		}
		if size := n.Pool.Pool.Size(); size.IsInt64() && size.Int64() < need {
			warnings = append(warnings, fmt.Sprintf("migration.inCluster.pool %s has %d addresses for %d nodes and holders: some virt-handlers will be denied", n.Pool.Pool, size.Int64(), need))
		}
	}
	if cc := m.CrossCluster; cc != nil {
		if err := nadExists(cc.NAD, p.Child("crossCluster", "nad")); err != nil {
			return nil, nil, err
		}
		replicas, err := holderReplicas(ctx, r, cc)
		if err != nil {
			return nil, nil, err
		}
		fp := p.Child("crossCluster", "addresses")
		switch have := int64(len(cc.Addresses)); {
		case have < replicas:
			errs = append(errs, field.Invalid(fp, have, fmt.Sprintf("%d addresses for %d holder replicas: every holder needs one", have, replicas)))
		case have == replicas && replicas > 0:
			warnings = append(warnings, fmt.Sprintf("%s: %d addresses for %d holder replicas leave none spare; a rolling update cannot surge until an old holder is gone", fp, have, replicas))
		}
	}
	return errs, warnings, nil
}

// holderReplicas sums the replicas of the Deployments whose pods the
// cross-cluster selector picks, in the NAD's namespace: the holders attach
// the NAD, so they live where it does (KubeVirt's namespace).
func holderReplicas(ctx context.Context, r client.Reader, cc *config.CrossClusterMigration) (int64, error) {
	ns := cc.NAD.Namespace
	sel := config.DefaultCrossClusterSelector
	if cc.PodSelector != nil {
		sel = cc.PodSelector
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return 0, err
	}
	var deps appsv1.DeploymentList
	if err := r.List(ctx, &deps, client.InNamespace(ns)); err != nil {
		return 0, fmt.Errorf("listing Deployments in %s: %w", ns, err)
	}
	var n int64
	for _, d := range deps.Items {
		if !s.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		if d.Spec.Replicas == nil {
			n++
		} else {
			n += int64(*d.Spec.Replicas)
		}
	}
	return n, nil
}

// Checker runs CheckCluster when the config changes and every Interval, and
// logs what it finds: a config that names a missing NAD or has too few
// cross-cluster addresses is valid YAML, so the reload accepts it, and this
// is where the admin hears about it.
type Checker struct {
	Reader   client.Reader
	Config   *config.Source
	Log      logr.Logger
	Interval time.Duration
}

// Start implements manager.Runnable.
func (c *Checker) Start(ctx context.Context) error {
	interval := c.Interval
	if interval == 0 {
		interval = 5 * time.Minute
	}
	var last *config.Config
	var lastRun time.Time
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		cur := c.Config.Get()
		if cur != nil && cur.Migration.Enabled() && (cur != last || time.Since(lastRun) >= interval) {
			last, lastRun = cur, time.Now()
			errs, warnings, err := CheckCluster(ctx, c.Reader, &cur.Migration)
			switch {
			case err != nil:
				c.Log.Error(err, "checking the migration config against the cluster")
			case len(errs) > 0:
				c.Log.Error(errs.ToAggregate(), "the migration config does not fit the cluster")
			}
			for _, w := range warnings {
				c.Log.Info("migration config warning: " + w)
			}
			configProblems.Set(float64(len(errs)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
