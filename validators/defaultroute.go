package validators

import (
	"context"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/kubeovn"
)

// DefaultRoute refuses more than one default-route attachment: kube-ovn
// would install two default routes and the guest's traffic would leave by
// whichever it configured last.
type DefaultRoute struct{}

// Name implements chain.VMValidator.
func (DefaultRoute) Name() string { return "default-route" }

// Validate implements chain.VMValidator.
func (DefaultRoute) Validate(_ context.Context, req *chain.Request) (field.ErrorList, error) {
	var keys []string
	for k, v := range req.TemplateMeta.Annotations {
		if strings.HasSuffix(k, kubeovn.DefaultRoute) && v == "true" {
			keys = append(keys, k)
		}
	}
	if len(keys) < 2 {
		return nil, nil
	}
	sort.Strings(keys)
	var errs field.ErrorList
	for _, k := range keys[1:] {
		errs = append(errs, field.Invalid(req.TemplateMetaPath.Child("annotations").Key(k), "true",
			"only one network may carry the default route; "+keys[0]+" already does"))
	}
	return errs, nil
}
