//go:build !stasis_failpoints

package failpoint

// Active is false: stasis is built without failpoints.
func Active(string) bool { return false }
