package app

import "flag"

// goFlagSet is a fresh Go flag set for libraries that bind to one (zap).
func goFlagSet() *flag.FlagSet { return flag.NewFlagSet("kvnet", flag.ContinueOnError) }
