//! `bootsman-operator`: the provisioning operator of Bootsman. It turns a BootsmanCluster into the
//! Cluster API objects of a child cluster (fetch → validate → render → apply → status) and keeps
//! them matching the spec.
