package chain

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/metrics"
)

// RunVMMutators runs ms in order, then records what they changed in
// kvnet.io/mutations.
func RunVMMutators(ctx context.Context, req *Request, ms []VMMutator) error {
	for _, m := range ms {
		err := step(ctx, "mutator", m.Name(), string(req.Kind), func() (bool, error) {
			if err := m.Mutate(ctx, req); err != nil {
				return false, fmt.Errorf("mutator %s: %w", m.Name(), err)
			}
			return false, nil
		})
		if err != nil {
			return err
		}
	}
	return recordChanges(req)
}

// RunVMValidators runs every validator and joins their errors.
func RunVMValidators(ctx context.Context, req *Request, vs []VMValidator) (field.ErrorList, error) {
	var all field.ErrorList
	for _, v := range vs {
		err := step(ctx, "validator", v.Name(), string(req.Kind), func() (bool, error) {
			errs, err := v.Validate(ctx, req)
			all = append(all, errs...)
			return len(errs) > 0, err
		})
		if err != nil {
			return nil, err
		}
	}
	return all, nil
}

// RunMigrationValidators runs every migration validator and joins their
// errors.
func RunMigrationValidators(ctx context.Context, req *MigrationRequest, vs []MigrationValidator) (field.ErrorList, error) {
	var all field.ErrorList
	for _, v := range vs {
		err := step(ctx, "validator", v.Name(), string(KindVMIM), func() (bool, error) {
			errs, err := v.ValidateMigration(ctx, req)
			all = append(all, errs...)
			return len(errs) > 0, err
		})
		if err != nil {
			return nil, err
		}
	}
	return all, nil
}

// RunPodMutators runs ms in order, then records what they changed in the
// pod's spec in its kvnet.io/mutations.
func RunPodMutators(ctx context.Context, req *PodRequest, ms []PodMutator) error {
	for _, m := range ms {
		err := step(ctx, "pod mutator", m.Name(), "Pod", func() (bool, error) {
			if err := m.MutatePod(ctx, req); err != nil {
				return false, fmt.Errorf("pod mutator %s: %w", m.Name(), err)
			}
			return false, nil
		})
		if err != nil {
			return err
		}
	}
	return recordPodChanges(req)
}

// step runs one mutator or validator (what names which) for the step
// metrics, and turns a panic into an error that names the step: one broken
// step answers 500 for its request instead of taking the connection down.
// f reports whether the step refused the object.
func step(ctx context.Context, what, name, kind string, f func() (refused bool, err error)) (err error) {
	start := time.Now()
	refused := false
	defer func() {
		if p := recover(); p != nil {
			logf.FromContext(ctx).Error(fmt.Errorf("%v", p), what+" panicked", "step", name, "stack", string(debug.Stack()))
			err = fmt.Errorf("%s %s failed unexpectedly: %v", what, name, p)
		}
		metrics.ObserveStep(name, kind, start, err, refused)
	}()
	refused, err = f()
	return err
}
