// Package chart loads and renders the postgrescluster Helm chart the way the operator's Helm
// manager does, for tests and tools.
package chart
