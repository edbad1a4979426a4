package framework

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// DaemonSetPod is the pod the DaemonSet controller creates for node, for
// control planes without kube-controller-manager: no name but
// generateName, no nodeName (the scheduler would bind it), the node only in
// the required node affinity's matchFields, and the DaemonSet as
// controller. kvnet's migration webhook reads the node from that affinity.
func DaemonSetPod(ds *appsv1.DaemonSet, node string) *corev1.Pod {
	tpl := ds.Spec.Template.DeepCopy()
	spec := tpl.Spec
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ds.Namespace, GenerateName: ds.Name + "-", Labels: tpl.Labels, Annotations: tpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: spec,
	}
}
