package config

import "k8s.io/apimachinery/pkg/util/validation/field"

// validateMigration checks the migration section. The migration-network
// capability owns this file.
func validateMigration(m *Migration, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if ic := m.InCluster; ic != nil {
		if ic.NAD == "" {
			errs = append(errs, field.Required(p.Child("inCluster", "nad"), "the NAD of the in-cluster migration network"))
		}
		if ic.Pool.CIDR == "" {
			errs = append(errs, field.Required(p.Child("inCluster", "pool", "cidr"), "the subnet the addresses come from"))
		}
	}
	if cc := m.CrossCluster; cc != nil {
		if cc.NAD == "" {
			errs = append(errs, field.Required(p.Child("crossCluster", "nad"), "the NAD of the cross-cluster migration network"))
		}
		if len(cc.Addresses) == 0 {
			errs = append(errs, field.Required(p.Child("crossCluster", "addresses"), "the addresses the cross-cluster holders share"))
		}
	}
	return errs
}
