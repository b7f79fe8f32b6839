// Package driverkit holds the small pieces several kv drivers share, written
// once: the hex-escape codec that maps keys onto a backend's alphabet, the
// exclusive upper bound of a prefix range, the splitting of a store URL's
// query into the driver's own parameters and the rest, and the masking of
// credentials in errors.
//
// It is internal to package kv's tree: drivers use it, users never see it.
package driverkit
