// Kept in step with nsenterEnv in nsenter.go.
#define NSENTER_ENV "STASIS_CRIU_NSENTER"
