// Package lookuptest builds the cluster facts unit tests run against: NADs
// parsed as the webhook's cache parses them, in a lookup.Snapshot.
package lookuptest

import (
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// NAD parses a NAD of namespace/name with cniConfig (and the device-plugin
// resource, when not "") the way the webhook's cache does.
func NAD(namespace, name, resource, cniConfig string) *netattach.Info {
	n := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: cniConfig},
	}
	if resource != "" {
		n.Annotations = map[string]string{netattach.ResourceNameAnnotation: resource}
	}
	return netattach.Parse(n)
}

// Facts is a snapshot holding nads, keyed as the cache keys them.
func Facts(nads ...*netattach.Info) *lookup.Snapshot {
	s := &lookup.Snapshot{NADs: map[string]*netattach.Info{}}
	for _, i := range nads {
		s.NADs[i.Ref()] = i
	}
	return s
}
