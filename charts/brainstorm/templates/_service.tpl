{{/*
The objects of one service (`brainstorm serve <name>`), shared by every entry of .Values.services.
Each helper takes (dict "root" $ "name" <service name> "svc" <its values entry>).
*/}}

{{/* <fullname>-<service>, the name of the service's Deployment, Service, HPA and PDB. */}}
{{- define "brainstorm.service.fullname" -}}
{{- printf "%s-%s" (include "brainstorm.fullname" .root) .name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "brainstorm.service.selectorLabels" -}}
{{ include "brainstorm.selectorLabels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{- define "brainstorm.service.labels" -}}
{{ include "brainstorm.labels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* BR_<NAME>_URL, the variable by which other processes find a service's gRPC server. */}}
{{- define "brainstorm.service.urlVariable" -}}
{{- printf "BR_%s_URL" (.name | upper | replace "-" "_") }}
{{- end }}

{{/* The container environment of a service. */}}
{{- define "brainstorm.service.env" -}}
{{- $root := .root }}
{{- $name := .name }}
{{- $svc := .svc }}
{{- $values := $root.Values }}
{{- include "brainstorm.commonEnv" $root }}
- name: BR_LISTEN
  value: "0.0.0.0:{{ $values.ports.http }}"
{{- if $svc.grpc }}
- name: BR_GRPC_LISTEN
  value: "0.0.0.0:{{ $values.ports.grpc }}"
{{- end }}
- name: BR_MAIL_OUTBOX
  value: {{ $values.mailOutbox.path | quote }}
- name: BR_REGISTRATION_MODE
  value: {{ $values.config.registrationMode | quote }}
{{- with $values.config.publicUrl }}
- name: BR_PUBLIC_URL
  value: {{ . | quote }}
{{- end }}
{{- with $values.config.dashboardUrl }}
- name: BR_DASHBOARD_URL
  value: {{ . | quote }}
{{- end }}
{{- with $values.config.kafkaBrokers }}
- name: BR_KAFKA_BROKERS
  value: {{ . | quote }}
{{- end }}
{{- with $values.config.idp.issuer }}
- name: BR_IDP_ISSUER
  value: {{ . | quote }}
- name: BR_IDP_JWKS_URL
  value: {{ required "config.idp.jwksUrl is required with config.idp.issuer" $values.config.idp.jwksUrl | quote }}
{{- with $values.config.idp.audience }}
- name: BR_IDP_AUDIENCE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- /* Every other enabled gRPC service of the release. */}}
{{- range $other, $otherSvc := $values.services }}
{{- if and $otherSvc.enabled $otherSvc.grpc (ne $other $name) }}
{{- $target := dict "root" $root "name" $other }}
- name: {{ include "brainstorm.service.urlVariable" $target }}
  value: {{ printf "http://%s:%v" (include "brainstorm.service.fullname" $target) $values.ports.grpc | quote }}
{{- end }}
{{- end }}
{{- $envNames := include "brainstorm.secretEnvNames" $root | fromYaml }}
{{- range $key := $svc.secretEnv | default list }}
- name: {{ index $envNames $key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "brainstorm.secretName" $root }}
      key: {{ index $values.secrets.keys $key }}
      {{- if ne $key "databaseUrl" }}
      optional: true
      {{- end }}
{{- end }}
{{- if ($svc.tls | default dict).secretName }}
- name: BR_TLS_CERT_FILE
  value: /etc/brainstorm/tls/tls.crt
- name: BR_TLS_KEY_FILE
  value: /etc/brainstorm/tls/tls.key
{{- end }}
{{- with ($svc.clientCertificates | default dict) }}
{{- if .header }}
- name: BR_CLIENT_CERT_HEADER
  value: {{ .header | quote }}
- name: BR_CLIENT_CERT_TRUSTED_PROXIES
  value: {{ required "services.edge-router.clientCertificates.trustedProxies must name the proxies trusted to forward client certificates" (join "," (.trustedProxies | default list)) | quote }}
{{- end }}
{{- end }}
{{- with $values.config.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with $svc.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "brainstorm.service.deployment" -}}
{{- $root := .root }}
{{- $name := .name }}
{{- $svc := .svc }}
{{- $values := $root.Values }}
{{- $autoscaling := $svc.autoscaling | default dict -}}
{{- $tls := ($svc.tls | default dict).secretName | default "" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "brainstorm.service.fullname" . }}
  labels:
    {{- include "brainstorm.service.labels" . | nindent 4 }}
spec:
  {{- if not $autoscaling.enabled }}
  replicas: {{ hasKey $svc "replicas" | ternary $svc.replicas 1 }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 25%
      maxUnavailable: 0
  selector:
    matchLabels:
      {{- include "brainstorm.service.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "brainstorm.service.labels" . | nindent 8 }}
        {{- with $svc.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if or (not $values.secrets.existingSecret) $svc.podAnnotations }}
      annotations:
        {{- if not $values.secrets.existingSecret }}
        {{- /* Roll the pods when the chart-made Secret changes. */}}
        checksum/secrets: {{ include (print $root.Template.BasePath "/secret.yaml") $root | sha256sum }}
        {{- end }}
        {{- with $svc.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "brainstorm.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ $values.terminationGracePeriodSeconds }}
      containers:
        - name: {{ $name }}
          image: {{ include "brainstorm.image" $root | quote }}
          imagePullPolicy: {{ $values.image.pullPolicy }}
          {{- with $values.image.command }}
          command:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          args:
            - serve
            - {{ $name }}
          ports:
            - name: http
              containerPort: {{ $values.ports.http }}
              protocol: TCP
            {{- if $svc.grpc }}
            - name: grpc
              containerPort: {{ $values.ports.grpc }}
              protocol: TCP
            {{- end }}
          env:
            {{- include "brainstorm.service.env" . | nindent 12 }}
          readinessProbe:
            httpGet:
              path: /health
              port: http
              scheme: {{ if $tls }}HTTPS{{ else }}HTTP{{ end }}
            {{- toYaml $values.probes.readiness | nindent 12 }}
          livenessProbe:
            httpGet:
              path: /health
              port: http
              scheme: {{ if $tls }}HTTPS{{ else }}HTTP{{ end }}
            {{- toYaml $values.probes.liveness | nindent 12 }}
          {{- if gt (int $values.preStopSleepSeconds) 0 }}
          lifecycle:
            preStop:
              sleep:
                seconds: {{ $values.preStopSleepSeconds }}
          {{- end }}
          {{- with $svc.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- include "brainstorm.containerSecurityContext" $root | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            - name: outbox
              mountPath: {{ $values.mailOutbox.path }}
            {{- if $tls }}
            - name: tls
              mountPath: /etc/brainstorm/tls
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        - name: outbox
          emptyDir:
            sizeLimit: {{ $values.mailOutbox.sizeLimit }}
        {{- if $tls }}
        - name: tls
          secret:
            secretName: {{ $tls }}
        {{- end }}
      {{- with $svc.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}

{{- define "brainstorm.service.service" -}}
{{- $root := .root }}
{{- $svc := .svc }}
{{- $service := $svc.service | default dict -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "brainstorm.service.fullname" . }}
  labels:
    {{- include "brainstorm.service.labels" . | nindent 4 }}
  {{- with $service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ $service.type | default "ClusterIP" }}
  selector:
    {{- include "brainstorm.service.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ $root.Values.ports.http }}
      targetPort: http
      protocol: TCP
      appProtocol: {{ if ($svc.tls | default dict).secretName }}https{{ else }}http{{ end }}
    {{- if $svc.grpc }}
    - name: grpc
      port: {{ $root.Values.ports.grpc }}
      targetPort: grpc
      protocol: TCP
      appProtocol: kubernetes.io/h2c
    {{- end }}
{{- end }}

{{- define "brainstorm.service.hpa" -}}
{{- $autoscaling := .svc.autoscaling }}
{{- if not (or $autoscaling.targetCPUUtilizationPercentage $autoscaling.targetMemoryUtilizationPercentage) }}
{{- fail (printf "services.%s.autoscaling: set targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" .name) }}
{{- end -}}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "brainstorm.service.fullname" . }}
  labels:
    {{- include "brainstorm.service.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "brainstorm.service.fullname" . }}
  minReplicas: {{ $autoscaling.minReplicas | default 1 }}
  maxReplicas: {{ $autoscaling.maxReplicas }}
  metrics:
    {{- with $autoscaling.targetCPUUtilizationPercentage }}
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ . }}
    {{- end }}
    {{- with $autoscaling.targetMemoryUtilizationPercentage }}
    - type: Resource
      resource:
        name: memory
        target:
          type: Utilization
          averageUtilization: {{ . }}
    {{- end }}
{{- end }}

{{- define "brainstorm.service.pdb" -}}
{{- $pdb := .svc.pdb -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "brainstorm.service.fullname" . }}
  labels:
    {{- include "brainstorm.service.labels" . | nindent 4 }}
spec:
  {{- if not (kindIs "invalid" $pdb.maxUnavailable) }}
  maxUnavailable: {{ $pdb.maxUnavailable }}
  {{- else }}
  minAvailable: {{ $pdb.minAvailable | default 1 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "brainstorm.service.selectorLabels" . | nindent 6 }}
{{- end }}
