// Package deploy holds no code: its tests check the deployment files
// beside them (kubernetes/, grafana/) with the Kubernetes API types and
// Prometheus's PromQL parser. It is a Go module of its own so that those
// dependencies stay out of the service's go.mod. Run: cd deploy && go
// test ./... (make deploy-check).
package deploy
